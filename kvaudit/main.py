"""The console entry point. ``kvaudit --version`` is answered here, before the CLI is loaded (typer, which
loads pydantic, and the engines): a script that asks the version, or a health check's first probe, pays
for Python's start and nothing else. Everything else goes to :func:`kvaudit.cli.main`."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from kvaudit import __version__

        sys.stdout.write(f"kvaudit {__version__}\n")
        sys.stdout.flush()
        sys.exit(0)
    from kvaudit.cli import main as cli_main

    cli_main()
