"""``kvaudit.toml``: defaults for ``fleet``, ``check``, ``capture`` and ``history``. Precedence: command-line
flags, then the file, then built-in defaults.

Which file: ``--config FILE``; else ``./kvaudit.toml``; else the user's ``$XDG_CONFIG_HOME/kvaudit/kvaudit.toml``
(``~/.config/...``); else the system's ``/etc/kvaudit/kvaudit.toml``. ``--no-config`` reads none. A file kvaudit
found rather than was handed is announced on stderr ("using ./kvaudit.toml"), so it never changes a run silently.

The working directory is not trusted: a cloned repository may carry a ``kvaudit.toml``. A file found there may not
choose what kvaudit runs, trusts or writes: ``ssh_config`` (its ProxyCommand and ``Match exec`` run as the user),
``accept_new_host_key`` (trust on first use) and the output paths (``history``, ``textfile_dir``, ``html``,
``csv``) are refused with the way to trust it (``--config ./kvaudit.toml``). Settings are typed: a string is not
a boolean ("false" would be true), a timeout is a finite number of seconds within a bound (``inf``, ``nan`` and
``1e300`` would leave nothing with a deadline), from the file or the command line. Each command takes the keys that
mean something to it (``check`` has no use for ``parallel``); an unknown key is an error wherever it is read.

The file itself is bounded before it is read: a regular file (a FIFO or ``/dev/zero`` behind ``./kvaudit.toml``
is refused, never waited on) of at most 1 MiB. An error names the file and the key or line, never the file's
text (a settings path pointed at a credentials file must not print it).

Acknowledgements (``ignore``, ``baseline``) from a file found in the working directory are limited and said: such
a file may acknowledge only config-level findings, never a node-level one (``kvaudit.health.NODE_CODES``:
another process on the GPUs, memory held before the start, GPUs missing) nor a state (``NO_GPU_READINGS``,
``NO_CONFIG``), so a cloned repository cannot turn a node's critical health check into ok; what it does
acknowledge is named in the announcement on stderr. Named with ``--config`` (or the user's or system's file), it
is trusted."""

from __future__ import annotations

from kvaudit.errors import KvauditError
from kvaudit.record import record
import math
import os
import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class SettingsError(KvauditError):
    pass


@record
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
#: the largest value each number may take (a day for a host, a week for a run): beyond, a deadline means nothing
#: and Python's own timers refuse it (``threading.Timer(1e300)``: OverflowError in the watchdog thread)
BOUNDS: dict[str, float] = {"timeout": 86_400.0, "run_timeout": 604_800.0, "connect_timeout": 3_600.0,
                            "parallel": 1024}
#: a settings file larger than this is not a settings file
MAX_FILE_BYTES = 1 << 20
_FLAG = {"timeout": "--timeout", "run_timeout": "--run-timeout", "connect_timeout": "--connect-timeout",
         "parallel": "--parallel"}
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]{1,40}")
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
    if here.exists() or here.is_symlink():  # a dangling link, a FIFO, a device: found, and refused when read
        return here, False
    for p in (_user_file(), SYSTEM_FILE):
        if p.is_file():
            return p, True
    return None, True


def _kind(v: Any) -> str:
    """What a value is, without its text (a string from a file may be anything: a token, a password)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if math.isfinite(v) and abs(v) < 1e15 else "a number out of range"
    names: dict[type, str] = {str: "a string", list: "a list", dict: "a table"}
    return names.get(type(v), type(v).__name__)


def _number_ok(key: str, v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= BOUNDS[key]


def _check_type(p: Path, key: str, v: Any) -> None:
    if v is None:
        return
    types, say = _TYPES.get(key, ((str,), "a string"))
    # bool is an int to Python: a boolean is never a count or a number of seconds
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
    if ok and key in _POSITIVE:
        ok = _number_ok(key, v)
    if ok and key == "thresholds":
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v.values())
    if ok and key == "ignore":
        ok = all(isinstance(x, str) for x in v)
    if not ok:
        bound = f" above 0 and at most {BOUNDS[key]:,g}" if key in _POSITIVE else ""
        raise SettingsError(f"{p}: {key} must be {say}{bound}, not {_kind(v)}")


def check_number(key: str, v: Any) -> None:
    """A command-line number (``--timeout inf`` passes typer's ``min``): finite, above 0, within its bound."""
    if v is not None and not _number_ok(key, v):
        raise SettingsError(f"{_FLAG[key]} {_kind(v) if not isinstance(v, float) or math.isfinite(v) else v}: "
                            f"a number above 0 and at most {BOUNDS[key]:,g}")


def _acknowledged(p: Path, values: dict[str, Any], trusted: bool) -> tuple[str, ...]:
    """The codes the file's ``ignore`` and ``baseline`` acknowledge, each checked (a baseline only from a file that
    parses as one); a file found in the working directory may not acknowledge a node-level finding or a state."""
    from kvaudit import ignores

    entries = values.get("ignore") or []
    for i, text in enumerate(entries, 1):
        try:
            ignores.parse([text])
        except ignores.IgnoreError as exc:
            why = str(exc).split(": ", 1)[1] if " cannot be acknowledged" in str(exc) else (
                "not CODE or CODE@HOST with a code kvaudit emits (codes: docs/findings.md)")
            raise SettingsError(f"{p}: ignore entry {i}: {why}") from None
    try:
        rules = ignores.parse(list(entries), values.get("baseline"))
    except ignores.IgnoreError as exc:
        raise SettingsError(f"{p}: baseline: {exc}") from None
    codes = tuple(dict.fromkeys(r.code for r in rules))
    if not trusted:
        from kvaudit.health import NODE_CODES

        refused = [c for c in codes if c in NODE_CODES or c in ignores.STATES]
        if refused:
            raise SettingsError(
                f"./{p} may not acknowledge {', '.join(refused)}: a file found in the working directory "
                "acknowledges only config-level findings, never the node's own problems or missing readings; "
                f"pass it as --config ./{p} to trust it, or give --ignore on the command line")
    return codes


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
        if not p.exists() and not p.is_symlink():
            raise SettingsError(f"config file {path} does not exist")
    else:
        found, trusted = _find()
        if found is None:
            return FleetSettings(), None
        p = found
    from kvaudit.safefile import read_regular

    raw = read_regular(p, MAX_FILE_BYTES, "config file", SettingsError)
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SettingsError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:  # its words give the line and column, never the text
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
            shown = repr(k) if _BARE_KEY.fullmatch(k) else "a key"
            raise SettingsError(f"{p}: unknown setting {shown} (known: {', '.join(sorted(known))})")
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
    codes = _acknowledged(p, values, trusted)
    if announce is not None and path is None:
        shown = f"./{p}" if not p.is_absolute() else str(p)
        said = (f"; it acknowledges {', '.join(codes)}: not counted toward the status" if codes else "")
        announce(f"using {shown}{said} (--config FILE to choose, --no-config for none)")
    try:
        return FleetSettings(**values), str(p)
    except TypeError as exc:
        raise SettingsError(f"{p}: {exc}") from None


def merge(file: FleetSettings, **flags: Any) -> FleetSettings:
    """Flags that were given (not None) win over the file."""
    values = {f.name: getattr(file, f.name) for f in fields(FleetSettings)}
    for k, v in flags.items():
        if k in BOUNDS:
            check_number(k, v)
        if v is not None and v is not False:
            values[k] = v
    return FleetSettings(**values)
