"""`coevo train ...` commands."""

import typer

app = typer.Typer(help="train commands", no_args_is_help=True)
