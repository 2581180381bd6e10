"""The `coevo` command line.

Each command group lives in its own module and imports heavy libraries (torch, pyserini,
prefect) only inside its commands, so `coevo --help` answers at once.
"""

import os

import typer

from coevo.cli import baseline, data, init, params, repro, run, search, train

app = typer.Typer(
    name="coevo",
    help="Train retrievers with retrieval feedback: CoGR, GRAPE and CoHyDE on one pipeline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def offline_models() -> None:
    """Every command loads models offline unless the user says otherwise.

    No command should reach a model hub behind the user's back (a GPU worker without
    network would hang on a retry loop): HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE default to 1;
    set HF_HUB_OFFLINE=0 to let a model id be downloaded. Data downloads (`coevo data
    prepare wands --download`) go through plain HTTP and are not affected.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", os.environ["HF_HUB_OFFLINE"])


app.add_typer(data.app, name="data")
app.add_typer(baseline.app, name="baseline")
app.add_typer(train.app, name="train")
app.add_typer(run.app, name="run")
app.add_typer(params.app, name="params")
app.add_typer(repro.app, name="repro")
run.register_top_level(app)  # `coevo demo`, `coevo ui`
search.register_top_level(app)  # `coevo search`, `coevo evaluate`, `coevo promote`
init.register_top_level(app)  # `coevo init`
