"""``kvaudit.toml``: defaults for ``fleet``, ``check``, ``capture`` and ``history``. Precedence: command-line
flags, then the file, then built-in defaults.

Which file: ``--config FILE``; else ``./kvaudit.toml``; else the user's ``$XDG_CONFIG_HOME/kvaudit/kvaudit.toml``
(``~/.config/...``); else the system's ``/etc/kvaudit/kvaudit.toml``. ``--no-config`` reads none. A file kvaudit
found rather than was handed is announced on stderr ("using ./kvaudit.toml"), so it never changes a run silently.

The working directory is not trusted: a cloned repository may carry a ``kvaudit.toml``. A file found there may not
choose what kvaudit runs, trusts or writes: ``ssh_config`` (its ProxyCommand and ``Match exec`` run as the user),
``accept_new_host_key`` (trust on first use) and the output paths (``history``, ``textfile_dir``, ``html``,
``csv``) are refused with the way to trust it (``--config ./kvaudit.toml``). Settings are typed: a string is not
a boolean ("false" would be true), a timeout is a positive number. Each command takes the keys that mean something
to it (``check`` has no use for ``parallel``); an unknown key is an error wherever it is read."""

from __future__ import annotations

from kvaudit.errors import KvauditError
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SettingsError(KvauditError):
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


#: keys a file found in the working directory may not set (see the module docstring)
UNTRUSTED_REFUSED = ("ssh_config", "accept_new_host_key", "history", "textfile_dir", "html", "csv")
_POSITIVE = ("timeout", "run_timeout", "connect_timeout", "parallel")
#: what each key must be: (types, what to say)
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "parallel": ((int,), "a whole number of hosts"),
    "timeout": ((int, float), "a number of seconds"),
    "run_timeout": ((int, float), "a number of seconds"),
    "connect_timeout": ((int, float), "a number of seconds"),
    "accept_new_host_key": ((bool,), "true or false (not a string)"),
    "thresholds": ((dict,), "a table of numbers"),
    "ignore": ((list,), "a list of CODE or CODE@HOST strings"),
}


def _user_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "kvaudit" / "kvaudit.toml"


SYSTEM_FILE = Path("/etc/kvaudit/kvaudit.toml")


def _find() -> tuple[Path | None, bool]:
    """The file kvaudit reads when none is named, and whether it is trusted (not the working directory's)."""
    here = Path("kvaudit.toml")
    if here.exists():
        return here, False
    for p in (_user_file(), SYSTEM_FILE):
        if p.is_file():
            return p, True
    return None, True


def _check_type(p: Path, key: str, v: Any) -> None:
    if v is None:
        return
    types, say = _TYPES.get(key, ((str,), "a string"))
    # bool is an int to Python: a boolean is never a count or a number of seconds
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if ok and key in _POSITIVE and not v > 0:
        ok = False
    if ok and key == "thresholds":
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v.values())
    if ok and key == "ignore":
        ok = all(isinstance(x, str) for x in v)
    if not ok:
        raise SettingsError(f"{p}: {key} must be {say}{' above 0' if key in _POSITIVE else ''}, not {v!r}")


def load(path: str | None, no_config: bool = False, announce=None) -> tuple[FleetSettings, str | None]:
    """The settings and the file they came from. ``announce``: called with a line when a file is read without
    being named."""
    if no_config:
        if path:
            raise SettingsError("--config and --no-config exclude each other")
        return FleetSettings(), None
    trusted = True
    if path:
        p = Path(path)
        if not p.exists():
            raise SettingsError(f"config file {path} does not exist")
    else:
        found, trusted = _find()
        if found is None:
            return FleetSettings(), None
        p = found
        if announce is not None:
            shown = f"./{p}" if not p.is_absolute() else str(p)
            announce(f"using {shown} (--config FILE to choose, --no-config for none)")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{p}: not valid TOML ({exc})") from None
    section = doc.get("fleet", doc)
    if not isinstance(section, dict):
        raise SettingsError(f"{p}: [fleet] must be a table")
    known = {f.name: f for f in fields(FleetSettings)}
    values: dict[str, Any] = {}
    for k, v in section.items():
        key = k.replace("-", "_")
        if key in ("fleet",):
            continue
        if key not in known:
            raise SettingsError(f"{p}: unknown setting {k!r} (known: {', '.join(sorted(known))})")
        if not trusted and key in UNTRUSTED_REFUSED:
            raise SettingsError(
                f"./{p} may not set {k}: a file found in the working directory does not choose what kvaudit runs, "
                "trusts or writes (an ssh_config's ProxyCommand, trust on first use, output files); pass it as "
                f"--config ./{p} to trust it, or give {k} on the command line")
        _check_type(p, key, v)
        values[key] = v
    if "thresholds" in doc and "thresholds" not in values:
        _check_type(p, "thresholds", doc["thresholds"])
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
