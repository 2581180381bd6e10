"""`coevo baseline ...` commands."""

import typer

app = typer.Typer(help="baseline commands", no_args_is_help=True)
