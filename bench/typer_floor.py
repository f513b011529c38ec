"""The typer floor (bench/startup.py): a CLI written with typer that does no work, with kvaudit's shape (a root with
help, a command taking a log path and a couple of options, a second command), so that its start-up and its ``--help``
are what any typer CLI pays before it reads a byte. Nothing of kvaudit is imported."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(help="A typer CLI that does nothing: the start-up any typer CLI pays.", no_args_is_help=True)


@app.command()
def explain(
    log: Path = typer.Argument(..., help="A server's log file."),
    output_format: str = typer.Option("text", "--format", "-f", help="text or json."),
    all_startups: bool = typer.Option(False, "--all-startups", help="Every startup in the log."),
) -> None:
    """Explain one startup from its log."""
    print(log, output_format, all_startups)


@app.command()
def check(target: str = typer.Argument(..., help="A host, a capture or a pod.")) -> None:
    """Audit a live server."""
    print(target)


if __name__ == "__main__":
    app()
