"""The output formats, in one registry: which report each format renders for each command.

The CLI asks :func:`choose` for a format by name and calls its methods; it holds no per-format branches. Each
renderer module is imported only when its format is chosen (the CLI starts without them).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable, Iterable

from kvaudit.errors import KvauditError
from kvaudit.record import record


class FormatError(KvauditError):
    """A --format this command does not write (exit 2)."""


def _fn(path: str) -> Callable[..., str]:
    module, name = path.rsplit(":", 1)
    return getattr(import_module(module), name)


@record
class Format:
    """One output format. ``colour`` says whether it takes terminal colour and width; ``whatif`` whether
    ``kvaudit whatif`` and ``kvaudit history`` can write it."""

    name: str
    audits_fn: str  # explain: a list of audits
    hosts_fn: str  # check: a list of checked hosts
    fleet_fn: str  # fleet: the run, its drift and the previous run
    whatif_fn: str | None = None
    colour: bool = False
    #: fleet: the report in pieces, a host at a time (memory for one host, whatever the fleet's size)
    fleet_stream_fn: str | None = None
    plan_fn: str | None = None  # kvaudit plan

    def plan(self, plan: Any, width: int = 80) -> str:
        if self.plan_fn is None:
            raise FormatError(f"--format {self.name}: plan prints text, json or markdown")
        return _fn(self.plan_fn)(plan, **({"width": width} if self.colour else {}))

    def audits(self, audits: list[Any], color: bool = False, width: int = 80) -> str:
        return _fn(self.audits_fn)(audits, color=color and self.colour, **({"width": width} if self.colour else {}))

    def hosts(self, hosts: list[Any], color: bool = False, width: int = 80) -> str:
        return _fn(self.hosts_fn)(hosts, **({"color": color, "width": width} if self.colour else {}))

    def fleet(self, run: Any, drift: Any, previous_run: int | None, first_run: bool, color: bool = False,
              width: int = 120) -> str:
        fn = _fn(self.fleet_fn)
        if self.colour:
            return fn(run, drift, color=color, first_run=first_run, width=width)
        if self.name == "json":
            return fn(run, drift, previous_run, first_run=first_run)
        return fn(run, drift, first_run=first_run)

    def fleet_chunks(self, run: Any, drift: Any, previous_run: int | None, first_run: bool, color: bool = False,
                     width: int = 120) -> Iterable[str]:
        """The fleet report as pieces to write one after the other (one piece when the format does not stream)."""
        if self.fleet_stream_fn is not None:
            return _fn(self.fleet_stream_fn)(run, drift, previous_run, first_run=first_run)
        return (self.fleet(run, drift, previous_run, first_run, color=color, width=width),)

    def whatif(self, audit: Any, w: Any, color: bool = False, width: int = 80) -> str:
        if self.whatif_fn is None:
            raise FormatError(f"--format {self.name}: whatif prints text or json")
        return _fn(self.whatif_fn)(audit, w, **({"color": color, "width": width} if self.colour else {}))


FORMATS: dict[str, Format] = {
    f.name: f for f in (
        Format("text", "kvaudit.report.text:render", "kvaudit.report.host:render_text",
               "kvaudit.report.fleet:render_text", "kvaudit.report.text:render_whatif", colour=True,
               plan_fn="kvaudit.report.plan:render_text"),
        Format("json", "kvaudit.report.json:render", "kvaudit.report.host:render_json",
               "kvaudit.report.fleet:render_json", "kvaudit.report.json:render_whatif",
               fleet_stream_fn="kvaudit.report.fleet:iter_json", plan_fn="kvaudit.report.plan:render_json"),
        Format("markdown", "kvaudit.report.markdown:render", "kvaudit.report.host:render_markdown",
               "kvaudit.report.fleet:render_markdown", plan_fn="kvaudit.report.plan:render_markdown"),
    )
}

#: what the fleet writes beside its report, each with the flag that writes it (a --format of these is a mistake
#: with a known right answer)
FLEET_FILES = {"html": "--html FILE", "csv": "--csv FILE", "parquet": "--csv FILE --parquet",
               "prometheus": "--textfile-dir DIR"}


def choose(name: str, command: str = "") -> Format:
    """The format named by ``--format``, or a one-line error that names the choices for ``command``."""
    fmt = FORMATS.get(name)
    if command in ("whatif", "history", "diff"):
        if fmt is None or fmt.whatif_fn is None:
            raise FormatError(f"--format {name!r}: {command} prints text or json")
        return fmt
    if fmt is not None:
        return fmt
    if command == "fleet" and name in FLEET_FILES:
        raise FormatError(f"--format {name}: the fleet writes {name} beside its report: use {FLEET_FILES[name]} "
                          f"(--format is one of {', '.join(FORMATS)})")
    raise FormatError(f"--format {name!r}: choose one of {', '.join(FORMATS)}")
