"""``kvaudit.toml``: defaults for ``fleet``, ``check``, ``capture`` and ``history``. Precedence: command-line
flags, then the file, then built-in defaults. Read from ``--config FILE``; else ``./kvaudit.toml`` when it
exists, announced on stderr ("using ./kvaudit.toml"), so a file in the working directory never changes a run
silently; ``--no-config`` reads none. Each command takes the keys that mean something to it (``check`` has no
use for ``parallel``); an unknown key is an error wherever it is read."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SettingsError(Exception):
    pass


@dataclass(frozen=True)
class FleetSettings:
    parallel: int = 8
    timeout: float = 120.0  # per host
    run_timeout: float = 1800.0  # the whole run
    connect_timeout: float | None = None  # None: the ssh_config's ConnectTimeout, else 10 s
    unit: str | None = None
    source: str | None = None
    journal_directory: str | None = None
    ssh_config: str | None = None
    accept_new_host_key: bool = False
    history: str | None = None
    textfile_dir: str | None = None
    html: str | None = None
    csv: str | None = None
    thresholds: dict[str, float] | None = None
    ignore: list[str] | None = None  # acknowledged findings, CODE or CODE@HOST (as --ignore)
    baseline: str | None = None  # a file of them (as --baseline)


def load(path: str | None, no_config: bool = False, announce=None) -> tuple[FleetSettings, str | None]:
    """The settings and the file they came from. ``announce``: called with a line when ./kvaudit.toml is read
    without being named."""
    if no_config:
        if path:
            raise SettingsError("--config and --no-config exclude each other")
        return FleetSettings(), None
    p = Path(path) if path else Path("kvaudit.toml")
    if not p.exists():
        if path:
            raise SettingsError(f"config file {path} does not exist")
        return FleetSettings(), None
    if not path and announce is not None:
        announce(f"using ./{p} (--config FILE to choose, --no-config for none)")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{p}: not valid TOML ({exc})") from None
    section = doc.get("fleet", doc)
    known = {f.name: f for f in fields(FleetSettings)}
    values: dict[str, Any] = {}
    for k, v in section.items():
        key = k.replace("-", "_")
        if key in ("fleet",):
            continue
        if key not in known:
            raise SettingsError(f"{p}: unknown setting {k!r} (known: {', '.join(sorted(known))})")
        values[key] = v
    if "thresholds" in doc and "thresholds" not in values:
        values["thresholds"] = doc["thresholds"]
    try:
        return FleetSettings(**values), str(p)
    except TypeError as exc:
        raise SettingsError(f"{p}: {exc}") from None


def merge(file: FleetSettings, **flags: Any) -> FleetSettings:
    """Flags that were given (not None) win over the file."""
    values = {f.name: getattr(file, f.name) for f in fields(FleetSettings)}
    for k, v in flags.items():
        if v is not None and v is not False:
            values[k] = v
    return FleetSettings(**values)
