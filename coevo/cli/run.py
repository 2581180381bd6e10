"""`coevo run ...` (Prefect flows), `coevo demo` and `coevo ui`."""

import typer

app = typer.Typer(help="Run a method's full pipeline as a Prefect flow.", no_args_is_help=True)


def register_top_level(root: typer.Typer) -> None:
    """Commands that sit at the top level of `coevo`."""
