"""`coevo search`, `coevo evaluate`, `coevo promote`: use what was trained.

MODEL is any of:

- ``models:/coevo-<method>-<dataset>@champion`` (or ``@challenger``, or ``/<version>``): a
  registered version, read from the MLflow store of ``--tracking-uri`` (default:
  ``$MLFLOW_TRACKING_URI``, else the ``tracking.uri`` of the params file);
- ``runs:/<run_id>``: the retriever a flow run logged (``runs:/<run_id>/model``);
- a local folder: an MLflow model (with an ``MLmodel`` file), a saved retriever (with a
  ``manifest.json``), or a run directory (``data/models/<method>/<dataset>``: the phase chosen
  on val is served, with the params the folder records in its ``params.yaml``; ``--set``
  still applies; folders trained before that file existed need the ``--params`` they were
  trained with).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

import typer

from coevo.cli.common import console, err_console, user_errors

if TYPE_CHECKING:  # types only: importing them here would pull in heavy libraries or cycles
    from coevo.config import Params
    from coevo.data.schema import Dataset
    from coevo.serving.search import Retriever

PARAMS_HELP = ("Params file(s) (repeat to overlay): the tracking store; a run directory brings its own (its "
               "params.yaml, what it was trained with).")
SET_HELP = "Override a param, KEY=VALUE (repeatable)."
TRACKING_HELP = "MLflow tracking store of models:/ and runs:/ URIs (default: $MLFLOW_TRACKING_URI, else tracking.uri of the params)."
MODEL_HELP = "models:/coevo-<method>-<dataset>@champion, runs:/<run_id>, a model folder or a run directory."


def _params(paths: list[Path], overrides: list[str]):
    from coevo.config import load_params

    existing = [p for p in paths if p.exists()]
    if not existing:
        return None
    return load_params(existing, overrides)


def tracking_uri(option: str | None, params: Params | None) -> str | None:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else params' tracking.uri (a relative sqlite path made absolute)."""
    uri = option or os.environ.get("MLFLOW_TRACKING_URI") or (params.tracking.uri if params is not None else None)
    if uri and uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    return uri


def open_model(model: str, *, params_paths: list[Path], overrides: list[str], tracking: str | None = None,
               method: str | None = None, data: Path | None = None):
    """The :class:`~coevo.serving.search.Retriever` MODEL names (see the module notes)."""
    from transformers.utils import logging as hf_logging

    from coevo.serving import search

    hf_logging.disable_progress_bar()  # "Loading weights" bars: the CLI shows its own status

    params = _params(params_paths, overrides)
    if model.startswith(("models:/", "runs:/")):
        from coevo.serving.pyfunc import load_retriever

        return load_retriever(model, tracking=tracking_uri(tracking, params))
    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(f"{model}: no such folder, and not a models:/ or runs:/ URI")
    if (path / "MLmodel").exists():
        from coevo.serving.pyfunc import load_retriever

        return load_retriever(str(path.resolve()))
    if (path / search.FILES["manifest"]).exists():
        return search.Retriever.load(path)
    from coevo.methods import SPECS

    method = method or search.method_of_run_dir(path)
    if method is None:
        raise ValueError(f"{path}: cannot tell the method of this run directory (it is not <root>/models/<method>/"
                         f"<dataset>); pass --method {'|'.join(SPECS)}")
    from coevo.layout import RUN_PARAMS

    if (path / RUN_PARAMS).is_file():  # what it was trained with: other params would name other phase keys
        from coevo.config import load_params

        params = load_params([path / RUN_PARAMS], overrides, method=method)
    if params is None:
        raise FileNotFoundError(f"{', '.join(map(str, params_paths))}: no params file, and {path} has no {RUN_PARAMS} "
                                "of its own (run folders trained before it was recorded); pass the params it was "
                                "trained with (--params)")
    if data is None:
        layout_data = path.resolve().parent.parent.parent / "processed" / path.name
        data = layout_data if (layout_data / "dataset.json").exists() else \
            Path(params.data.root) / "processed" / params.data.dataset
    return search.from_run(method, path, params, data)


def _print_record(record: dict[str, Any], generated: str) -> None:
    from rich.table import Table

    shown = record[generated]
    if isinstance(shown, list):
        shown = ", ".join(shown) if shown else "(none)"
    elif shown is None:
        shown = "(malformed: searched as the empty string)"
    table = Table(title=f"{record['query']}", title_justify="left", caption=f"{generated}: {shown}",
                  caption_justify="left")
    table.add_column("#", justify="right")
    table.add_column("item_id")
    table.add_column("title")
    table.add_column("score", justify="right")
    for rank, hit in enumerate(record["results"], 1):
        table.add_row(str(rank), hit["item_id"], hit["title"], f"{hit['score']:.4f}")
    if not record["results"]:
        table.add_row("", "(no item shares a keyword)" if generated == "keywords" else "(no result)", "", "")
    console.print(table)


def _read_queries(file: Path) -> list[str]:
    from coevo.io import read_text

    return [line.strip() for line in read_text(file).splitlines() if line.strip()]


def search_command(
    query: Optional[str] = typer.Argument(None, help="The query (or use --file)."),
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    k: int = typer.Option(10, "--k", "-k", min=1, max=1000, help="Items to return per query."),
    as_json: bool = typer.Option(False, "--json", help="One JSON line per query: {query, keywords|rewrite|description, results}."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help="A file of queries, one per line (blank lines skipped)."),
    batch_size: int = typer.Option(16, "--batch-size", min=1, help="Queries generated together with --file."),
    params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p", help=PARAMS_HELP),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    method: Optional[str] = typer.Option(None, "--method", help="The method of a run directory outside the usual layout."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="The prepared data set of a run directory."),
    tracking: Optional[str] = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
) -> None:
    """Search a trained retriever: ranked items per query, with what its generator wrote
    (CoGR: the keywords; GRAPE: the rewrite; CoHyDE: the description)."""
    with user_errors():
        if (query is None) == (file is None):
            raise ValueError("give one query, or --file with one query per line")
        queries = [query] if file is None else _read_queries(file)
        if not queries:
            raise ValueError(f"{file}: no query in the file")
        with err_console.status(f"loading {model}"):
            retriever = open_model(model, params_paths=params, overrides=overrides, tracking=tracking,
                                   method=method, data=data)
        if file is None:
            records = retriever.search(queries, k)
            if as_json:
                print(json.dumps(records[0], ensure_ascii=False))
            else:
                _print_record(records[0], retriever.generated)
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task("search", total=len(queries))
            for start in range(0, len(queries), batch_size):
                for record in retriever.search(queries[start:start + batch_size], k):
                    if as_json:
                        print(json.dumps(record, ensure_ascii=False), flush=True)
                    else:
                        bar.console.print()  # keep tables clear of the bar
                        _print_record(record, retriever.generated)
                bar.advance(task, min(batch_size, len(queries) - start))


def model_table(retriever: Retriever, dataset: Dataset, split: str, params: Params | None, baselines: list[str]) -> dict[str, Any]:
    """The flow's final table for one served model: the baselines (k for F1@k chosen on val) on
    val and ``split``, the model on ``split``, and the paired comparison with the best baseline."""
    from coevo import report
    from coevo.methods.base import method_class
    from coevo.orchestration.pipeline import BASELINES, baseline_result

    ev = params.evaluation
    cutoffs = list(ev.cutoffs)
    bootstrap = ev.bootstrap.model_dump(mode="json")
    columns = report.table_columns(method_class(retriever.method).table_metrics)
    evaluation = retriever.evaluate(dataset, split, cutoffs)
    phase = retriever.manifest["phase"]
    row = {"label": f"{retriever.name} phase {phase}", "phase": phase, "split": split,
           "n_queries": evaluation.n_queries, **evaluation.means(),
           "per_query": {m: evaluation.per_query[m] for m in columns if m in evaluation.per_query}}
    final = {"split": split, "best_phase": phase, "start_phase": phase, "rows": [row]}
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {', '.join(unknown)}; expected {', '.join(BASELINES)}")
    results = {name: baseline_result(dataset, name, split, cutoffs, bootstrap) for name in baselines}
    table = report.evaluation_table(method=retriever.method, dataset=str(dataset.name), columns=columns, val_rows=[],
                                    final=final, baselines=results, bootstrap=bootstrap, cutoffs=cutoffs)
    # One served phase: no "vs start" (it would compare the model with itself).
    table["comparisons"] = [c for c in table["comparisons"] if c["name"] != report.VS_START]
    for r in table["rows"]:
        (r.get("comparisons") or {}).pop(report.VS_START, None)
    return table


def evaluate_command(
    data_dir: Path = typer.Argument(..., help="A prepared data set folder (items/queries/qrels.parquet)."),
    model: str = typer.Option(..., "--model", "-m", help=MODEL_HELP),
    split: str = typer.Option("test", "--split", help="Split to report on (k for the baselines' F1@k is chosen on val)."),
    baselines: str = typer.Option("bm25,dense", "--baselines", help="Comma-separated: bm25, dense."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the table as JSON here."),
    params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p", help=PARAMS_HELP + " Also the "
                                      "evaluation cut-offs and bootstrap settings."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    method: Optional[str] = typer.Option(None, "--method", help="The method of a run directory outside the usual layout."),
    tracking: Optional[str] = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
) -> None:
    """Evaluate a trained retriever on a data set: the flow's final table (baselines at the k
    chosen on val, 95% bootstrap CIs, the paired difference with the best baseline)."""
    with user_errors():
        from coevo.config import project_params
        from coevo.data.schema import Dataset
        from coevo.report import metrics_table

        loaded = _params(params, overrides) or project_params(*overrides)
        dataset = Dataset.load(data_dir)
        with err_console.status(f"loading {model}"):
            retriever = open_model(model, params_paths=params, overrides=overrides, tracking=tracking,
                                   method=method)
        with err_console.status(f"evaluating {retriever.name} and the baselines on {dataset.name} ({split})"):
            table = model_table(retriever, dataset, split, loaded, [b.strip() for b in baselines.split(",") if b.strip()])
        console.print(metrics_table(table["rows"], table["columns"],
                                    title=f"{retriever.name} ({retriever.describe()}) on {dataset.name}"))
        if out is not None:
            from coevo.io import write_json

            write_json(out, table)
            console.print(f"wrote {out}")


def promote_command(
    name: str = typer.Argument(..., help="Registered model, coevo-<method>-<dataset>."),
    force: bool = typer.Option(False, "--force", help="Move champion to the challenger without comparing."),
    metric: Optional[str] = typer.Option(None, "--metric", help="Metric of the comparison (default: the method's "
                                         "headline, CoGR f1, GRAPE recall@10, CoHyDE ndcg@5)."),
    data: Optional[Path] = typer.Option(None, "--data", "-d", help="Data set to compare on (default: the one the "
                                        "challenger was trained on, its coevo.dataset_dir tag)."),
    split: str = typer.Option("test", "--split", help="Split the comparison reads."),
    as_json: bool = typer.Option(False, "--json", help="Print the decision as JSON."),
    params: list[Path] = typer.Option([Path("params.yaml")], "--params", "-p", help=PARAMS_HELP),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    tracking: Optional[str] = typer.Option(None, "--tracking-uri", help=TRACKING_HELP),
) -> None:
    """Move alias champion to the challenger when it beats the champion on the test split
    (95% paired-bootstrap CI of the headline-metric difference above 0), or when there is
    no champion yet; otherwise keep the champion and say why.

    The champion's exact files: its model version's tags name the DVC experiment of the run
    that trained it (dvc.experiment, dvc.experiment_rev) and its checkpoint folder's md5
    (dvc.checkpoint_md5); `dvc exp apply <dvc.experiment>` brings that run's files back from
    DVC's cache (after `dvc pull` on another machine), and `dvc status` confirms them."""
    with user_errors():
        from mlflow.tracking import MlflowClient

        from coevo.serving import registry
        from coevo.serving.pyfunc import version_evaluator

        loaded = _params(params, overrides)
        uri = tracking_uri(tracking, loaded)
        if not uri:
            raise ValueError("no MLflow store: pass --tracking-uri or a params file with tracking.uri")
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        method = registry.method_of(name)
        metric = metric or registry.headline_metric(method, loaded)
        current = registry.aliases(client, name)
        if registry.CHALLENGER not in current:
            raise ValueError(f"{name}: no version has alias {registry.CHALLENGER!r} in {uri}")
        if data is None:
            tag = client.get_model_version(name, current[registry.CHALLENGER]).tags.get("coevo.dataset_dir")
            if not tag:
                raise ValueError(f"{name} v{current[registry.CHALLENGER]}: no coevo.dataset_dir tag; pass --data")
            data = Path(tag)
        needs_eval = not force and registry.CHAMPION in current and current[registry.CHAMPION] != current[registry.CHALLENGER]
        evaluate = version_evaluator(name, data, metric, split=split, tracking=uri) if needs_eval else None
        bootstrap = loaded.evaluation.bootstrap.model_dump(mode="json") \
            if loaded is not None and hasattr(loaded.evaluation, "bootstrap") else None
        with err_console.status(f"comparing {name} challenger and champion on {split}" if needs_eval else "promoting"):
            decision = registry.promote(client, name, metric=metric, evaluate=evaluate, force=force,
                                        bootstrap=bootstrap, split=split)
        if as_json:
            print(json.dumps(decision.as_dict(), default=str))
            return
        for line in registry.decision_lines({**decision.as_dict(), "summary": decision.summary()}):
            console.print(line, soft_wrap=True, highlight=False)


def register_top_level(root: typer.Typer) -> None:
    """`coevo search`, `coevo evaluate`, `coevo promote`."""
    for name, command in (("search", search_command), ("evaluate", evaluate_command), ("promote", promote_command)):
        root.command(name, help=" ".join(command.__doc__.split()))(command)
