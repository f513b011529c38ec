"""Before the first host is contacted: every path the run will write, the files it reads and the optional
libraries it needs are checked, so that a typo costs a second, not a 30-minute run whose report cannot be
written. One :class:`PreflightError` names every problem found."""

from __future__ import annotations

from kvaudit.errors import KvauditError
import importlib.util
import os
from pathlib import Path


class PreflightError(KvauditError):
    pass


def _writable_file(option: str, path: str) -> str | None:
    p = Path(path)
    if p.is_dir():
        return f"{option} {path}: is a directory; give a file name"
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        return f"{option} {path}: the directory {parent} does not exist"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{option} {path}: not writable"
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create a file in {parent}"
    return None


def check(*, output: str | None = None, html: str | None = None, csv: str | None = None, parquet: bool = False,
          history: str | None = None, textfile_dir: str | None = None, ssh_config: str | None = None) -> None:
    problems = []
    for option, path in (("-o/--output", output), ("--html", html), ("--csv", csv), ("--history", history)):
        if path:
            why = _writable_file(option, path)
            if why:
                problems.append(why)
    if history and Path(history).is_file():
        with open(history, "rb") as fh:
            head = fh.read(16)
        if head and head != b"SQLite format 3\x00":
            problems.append(f"--history {history}: exists and is not a SQLite file (a typo would overwrite it)")
    if textfile_dir:
        d = Path(textfile_dir)
        if not d.is_dir():
            problems.append(f"--textfile-dir {textfile_dir}: no such directory (node_exporter's textfile "
                            "collector reads an existing one; a new directory nobody scrapes helps no one)")
        elif not os.access(d, os.W_OK | os.X_OK):
            problems.append(f"--textfile-dir {textfile_dir}: not writable")
    if parquet:
        if not csv:
            problems.append("--parquet writes --csv's table: give --csv FILE too")
        if importlib.util.find_spec("pyarrow") is None:
            problems.append("--parquet needs pyarrow: pip install pyarrow (or 'kvaudit[parquet]')")
    if ssh_config and not Path(ssh_config).is_file():
        problems.append(f"--ssh-config {ssh_config}: no such file")
    if problems:
        raise PreflightError("; ".join(problems))
