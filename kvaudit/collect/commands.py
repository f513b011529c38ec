"""The fixed list of read-only commands kvaudit runs on an audited host.

Nothing here writes: each builder returns a shell string made from argv with every argument quoted
(``shlex.join``), so a hostile unit or container name reaches the host as one literal argument. The only
shell scripts are the constants below, which take user input as positional parameters, never as code.
:func:`is_allowed` is the gate every collector passes its commands through; tests hold it to that.
"""

from __future__ import annotations

import functools
import re
import shlex

#: largest line we keep from a log (a 50 MB journal line is cut on the host, never shipped)
MAX_LINE = 1 << 20
CONFIG_MAX_BYTES = 4 << 20

GPU_FIELDS = ("index", "uuid", "name", "pci.bus_id", "memory.total", "memory.reserved", "memory.used",
              "memory.free", "driver_version")
APP_FIELDS = ("pid", "gpu_uuid", "process_name", "used_memory")

# snapshot directories of a Hugging Face cache holding config.json, for a model id given as $1 (org--name)
HF_SNAPSHOT_SCRIPT = (
    'c="${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}/models--$1/snapshots"; '
    'for d in "$c"/*/; do [ -f "$d/config.json" ] && echo "$d"; done; exit 0'
)
# the PIDs in a unit's cgroup (v2, then v1), for ControlGroup given as $1
CGROUP_PIDS_SCRIPT = (
    'for f in "/sys/fs/cgroup$1/cgroup.procs" "/sys/fs/cgroup/systemd$1/cgroup.procs"; do '
    '[ -r "$f" ] && exec cat "$f"; done; exit 0'
)
SCRIPTS = (HF_SNAPSHOT_SCRIPT, CGROUP_PIDS_SCRIPT)

def _grep_filter(anchors: tuple[bytes, ...]) -> str:
    argv = ["grep", "-a", "-n", "-F"]
    for a in anchors:
        argv += ["-e", a.decode("latin-1")]
    return shlex.join(argv) + " | " + shlex.join(["cut", "-c", f"1-{MAX_LINE}"])


def _journal_base(directory: str | None) -> list[str]:
    return ["journalctl", "--no-pager", "-q"] + (["--directory", directory] if directory else [])


def list_units() -> str:
    return shlex.join(["systemctl", "list-units", "--type=service", "--all", "--no-legend", "--plain", "--no-pager"])


def journal_units(directory: str | None) -> str:
    return shlex.join(_journal_base(directory) + ["-F", "_SYSTEMD_UNIT"])


def invocation_id(unit: str) -> str:
    return shlex.join(["systemctl", "show", "-p", "InvocationID", "--value", "--", unit])


def control_group(unit: str) -> str:
    return shlex.join(["systemctl", "show", "-p", "ControlGroup", "--value", "--", unit])


def cgroup_pids(cgroup: str) -> str:
    return shlex.join(["sh", "-c", CGROUP_PIDS_SCRIPT, "sh", cgroup])


def last_invocation_in_journal(unit: str, directory: str | None) -> str:
    return shlex.join(_journal_base(directory) + [f"--unit={unit}", "-n", "1", "-o", "export",
                                                  "--output-fields=_SYSTEMD_INVOCATION_ID"])


def journal_lines(unit: str, invocation: str | None, directory: str | None, anchors: tuple[bytes, ...]) -> str:
    match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else [f"--unit={unit}"]
    return shlex.join(_journal_base(directory) + match + ["-o", "cat", "-a"]) + " | " + _grep_filter(anchors)


def docker_started(name: str) -> str:
    return shlex.join(["docker", "inspect", "-f", "{{.State.StartedAt}}", "--", name])


def docker_lines(name: str, since: str | None, anchors: tuple[bytes, ...]) -> str:
    argv = ["docker", "logs"] + (["--since", since] if since else []) + ["--", name]
    return shlex.join(argv) + " 2>&1 | " + _grep_filter(anchors)


def file_lines(path: str, anchors: tuple[bytes, ...]) -> str:
    argv = ["grep", "-a", "-n", "-F"]
    for a in anchors:
        argv += ["-e", a.decode("latin-1")]
    return shlex.join(argv + ["--", path]) + " | " + shlex.join(["cut", "-c", f"1-{MAX_LINE}"])


def query_gpus() -> str:
    return shlex.join(["nvidia-smi", f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"])


def query_apps() -> str:
    return shlex.join(["nvidia-smi", f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])


def read_config(path: str) -> str:
    return shlex.join(["head", "-c", str(CONFIG_MAX_BYTES), "--", path])


def hf_snapshots(model_id: str) -> str:
    return shlex.join(["sh", "-c", HF_SNAPSHOT_SCRIPT, "sh", model_id.replace("/", "--")])


def hostname() -> str:
    return "hostname"


# --- what the user may hand the builders -------------------------------------------------------------------
# A unit name or journal directory comes from the command line or an inventory: one the gate would refuse is
# the user's input, said as such before anything runs (the gate's refusal stays a kvaudit bug).

_UNIT_NAME = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]{1,255}")


def setting_problem(unit: str | None, journal_directory: str | None) -> str | None:
    """Why a --unit or --journal-directory cannot be passed to a host command, or None."""
    if unit is not None and not _UNIT_NAME.fullmatch(unit):
        return (f"--unit {unit!r}: a unit name is 1-255 characters without spaces, newlines or control characters "
                "(as systemd names units)")
    if journal_directory is not None and (not journal_directory.startswith("/")
                                          or any(ord(c) < 32 for c in journal_directory)):
        return (f"--journal-directory {journal_directory!r}: an absolute path on the audited host (journalctl "
                "--directory is read there, not relative to where kvaudit runs)")
    return None


# --- the gate ---------------------------------------------------------------------------------------------
# Each program's arguments are checked against exactly what the builders above produce: every option is
# spelled out in full (no abbreviation: ``journalctl --vac`` would reach ``--vacuum-*``), every value is of
# the expected kind, and anything else is refused. A refusal is a bug in kvaudit, never user input.

_HEX32 = re.compile(r"[0-9a-f]{32}")


def _argv_ok(argv: list[str]) -> bool:
    prog, args = argv[0], argv[1:]
    check = _PROGRAMS.get(prog)
    return check is not None and check(args)


def _options(args: list[str], flags: set[str], valued: dict[str, "re.Pattern[str]"],
             joined: dict[str, "re.Pattern[str]"], positional: "re.Pattern[str] | None" = None,
             after_dashdash: int = 0) -> bool:
    """``flags``: bare options; ``valued``: options whose value is the next argument, matching a pattern;
    ``joined``: ``--opt=value`` options; ``positional``: what a non-option argument may be; ``after_dashdash``:
    how many literal arguments may follow ``--`` (a unit, a path: anything, as data)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return after_dashdash > 0 and len(args) - i - 1 == after_dashdash
        if a in flags:
            i += 1
            continue
        if a in valued:
            if i + 1 >= len(args) or not valued[a].fullmatch(args[i + 1]):
                return False
            i += 2
            continue
        key, eq, value = a.partition("=")
        if eq and key in joined and joined[key].fullmatch(value):
            i += 1
            continue
        if positional is not None and not a.startswith("-") and positional.fullmatch(a):
            i += 1
            continue
        return False
    return after_dashdash == 0


_ANY = re.compile(r"(?s).*")
_ANY_LINE = re.compile(r".*")  # a unit name may not hold a newline (journalctl would read two matches)


def _journalctl(args: list[str]) -> bool:
    return _options(args, {"--no-pager", "-q", "-a"},
                    {"--directory": re.compile(r"/.*"), "-F": re.compile(r"_SYSTEMD_UNIT"), "-n": re.compile(r"1"),
                     "-o": re.compile(r"export|cat")},
                    {"--unit": _ANY_LINE, "--output-fields": re.compile(r"_SYSTEMD_INVOCATION_ID")},
                    positional=re.compile(r"_SYSTEMD_INVOCATION_ID=[0-9a-f]{32}"))


def _systemctl(args: list[str]) -> bool:
    if args[:1] == ["list-units"]:
        return args[1:] == ["--type=service", "--all", "--no-legend", "--plain", "--no-pager"]
    if args[:1] == ["show"]:
        return (len(args) == 6 and args[1] == "-p" and args[2] in ("InvocationID", "ControlGroup")
                and args[3] == "--value" and args[4] == "--")
    return False


def _grep(args: list[str]) -> bool:
    if args[:3] != ["-a", "-n", "-F"]:
        return False
    rest = args[3:]
    while rest[:1] == ["-e"] and len(rest) >= 2:
        rest = rest[2:]
    return rest == [] or (len(rest) == 2 and rest[0] == "--")


def _cut(args: list[str]) -> bool:
    return args == ["-c", f"1-{MAX_LINE}"]


def _docker(args: list[str]) -> bool:
    if args[:1] == ["logs"]:
        return _options(args[1:], set(), {"--since": re.compile(r"[0-9T:.+\-Z]{1,64}")}, {}, after_dashdash=1)
    if args[:1] == ["inspect"]:
        return args[1:3] == ["-f", "{{.State.StartedAt}}"] and len(args) == 5 and args[3] == "--"
    return False


def _nvidia_smi(args: list[str]) -> bool:
    return args in ([f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                    [f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])


def _head(args: list[str]) -> bool:
    return len(args) == 4 and args[:2] == ["-c", str(CONFIG_MAX_BYTES)] and args[2] == "--"


def _sh(args: list[str]) -> bool:
    return len(args) == 4 and args[0] == "-c" and args[1] in SCRIPTS and args[2] == "sh"


_PROGRAMS = {
    "journalctl": _journalctl, "systemctl": _systemctl, "grep": _grep, "cut": _cut, "docker": _docker,
    "nvidia-smi": _nvidia_smi, "head": _head, "sh": _sh, "hostname": lambda args: not args,
}


def _stages(command: str) -> list[str] | None:
    """The pipeline's stages: split at each `` | `` outside quotes (a model path may hold `` | ``; quoted by
    ``shlex.join`` it is one argument, not a pipe). None when a quote is left open."""
    stages, start, quote, i = [], 0, "", 0
    while i < len(command):
        c = command[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
        elif c in ("'", '"'):
            quote = c
        elif c == "\\":
            i += 1
        elif command.startswith(" | ", i):
            stages.append(command[start:i])
            start = i = i + 3
            continue
        i += 1
    if quote:
        return None
    stages.append(command[start:])
    return stages


@functools.lru_cache(maxsize=4096)  # a fleet sends the same commands to every host
def is_allowed(command: str) -> bool:
    """True when every stage of the pipeline is a read-only program from the list, with exactly the options
    kvaudit's builders use, and quoted exactly as ``shlex.join`` quotes it (so no unquoted ``;``, ``$(...)``,
    redirection or glob can hide in it)."""
    stages = _stages(command)
    if stages is None:
        return False
    for i, stage in enumerate(stages):
        if i == 0 and stage.startswith("docker logs ") and stage.endswith(" 2>&1"):
            stage = stage[: -len(" 2>&1")]  # docker writes the container's stderr to its own stderr
        try:
            argv = shlex.split(stage)
        except ValueError:
            return False
        if not argv or shlex.join(argv) != stage or not _argv_ok(argv):
            return False
    return True
