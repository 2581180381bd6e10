"""The `coevo` command line.

Each command group lives in its own module and imports heavy libraries (torch, pyserini,
prefect) only inside its commands, so `coevo --help` answers at once.
"""

import typer

from coevo.cli import baseline, data, params, repro, run, search, train

app = typer.Typer(
    name="coevo",
    help="Train retrievers with retrieval feedback: CoGR, GRAPE and CoHyDE on one pipeline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
app.add_typer(data.app, name="data")
app.add_typer(baseline.app, name="baseline")
app.add_typer(train.app, name="train")
app.add_typer(run.app, name="run")
app.add_typer(params.app, name="params")
app.add_typer(repro.app, name="repro")
run.register_top_level(app)  # `coevo demo`, `coevo ui`
search.register_top_level(app)  # `coevo search`, `coevo evaluate`, `coevo promote`
