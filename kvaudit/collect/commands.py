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

from kvaudit.record import record

#: the most seconds one nvidia-smi may take (it answers in about a second; a hung driver never does)
SMI_TIMEOUT_S = 20
SMI_MIN_S = 3
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
#: the kinds of log source the host script reads (``none``: no log, a pod's readings and config only)
SCRIPT_KINDS = ("journal", "dir", "docker", "file", "none")

# --- a running server's journal: its startup, not its serving ----------------------------------------------
# A server that has run for days has logged gigabytes since its start (decode batches, requests), and reading them
# all is journalctl's cost (13 s of a host core for 2 GiB): the audit reads the startup, which is at the start of
# the invocation and ends where the engine says it serves. So the invocation is read up to that line (an awk that
# passes lines through and exits there: journalctl then stops at its next write), unless its last lines say more
# than serving: an error, a failure, a kill, a memory word, another startup's markers (a crash, or a restart inside
# one invocation), when it is read to its end as before. awk (POSIX; mawk, gawk and BusyBox's) rather than sed: the
# strings are data (-v), never a program.

@record
class StartupWindow:
    """Where a startup ends in a journal, from the engine registry (kvaudit.engines.startup_window). ``markers``
    and ``ready`` are (engine, string) pairs: lines only that engine's startup prints, and the line it prints when
    it serves. A ready line ends the read when every engine whose markers came before it lists it (uvicorn's
    ``Application startup complete.`` ends LMDeploy's startup, not SGLang's, whose warm-up comes after it), and at
    least one did. ``tail_words`` (lower case): a line among the invocation's last ``tail_lines`` that holds one
    sends the read to the invocation's end."""

    markers: tuple[tuple[int, str], ...] = ()
    ready: tuple[tuple[int, str], ...] = ()
    tail_words: tuple[str, ...] = ()
    tail_lines: int = 2000

    def __post_init__(self) -> None:
        for text in [t for _, t in self.markers + self.ready] + list(self.tail_words):
            if not _WINDOW_WORD.fullmatch(text):
                raise ValueError(f"a startup window's string must be printable without tab or backslash: {text!r}")

    @property
    def args(self) -> tuple[str, str, str, str]:
        """The four positional parameters the journal scripts take: lines, words, markers, ready lines."""
        def pairs(items: tuple[tuple[int, str], ...]) -> str:
            return "\t".join(f"{e}\t{t}" for e, t in items)

        return str(self.tail_lines), "\t".join(self.tail_words), pairs(self.markers), pairs(self.ready)


#: a string awk -v takes as it is (-v processes backslash escapes) and a tab-joined list can hold
_WINDOW_WORD = re.compile(r"[^\t\n\\\x00-\x1f\x7f]{1,200}")
_PAIR = r"[0-9]{1,2}\t[^\t\n\\\x00-\x1f\x7f]{1,200}"
_WINDOW_PAIRS = re.compile(rf"(?:{_PAIR}(?:\t{_PAIR})*)?")
_WINDOW_WORDS = re.compile(r"(?:[^\t\n\\\x00-\x1f\x7f]{1,200}(?:\t[^\t\n\\\x00-\x1f\x7f]{1,200})*)?")
_TAIL_LINES = re.compile(r"[1-9][0-9]{0,5}")

#: exits 0 when a line holds one of the words $w (tab-joined, lower case): the tail says more than serving
TAIL_AWK = ('BEGIN { n = split(w, W, "\t") } { l = tolower($0); for (i = 1; i <= n; i++) if (index(l, W[i])) '
            '{ f = 1; exit } } END { exit !f }')
#: passes lines through and exits after the ready line that ends the startup (StartupWindow's rule)
STOP_AWK = ('BEGIN { nm = split(m, M, "\t"); nr = split(r, R, "\t") } { print; a = 0\n'
            'for (i = 1; i < nm; i += 2) if (!(M[i] in s) && index($0, M[i + 1])) s[M[i]] = 1\n'
            'for (i = 1; i < nr; i += 2) { t = R[i + 1]; if (length($0) >= length(t) && '
            'substr($0, length($0) - length(t) + 1) == t) { if (!a) split("", h); h[R[i]] = 1; a = 1 } }\n'
            'if (a) { ok = 0; for (e in s) if (e in h) ok = 1; else { ok = 0; break }; if (ok) exit } }')
#: the invocation's lines as journal_lines's plain read gives them, through its startup's ready line only when the
#: last lines say nothing but serving. $1 journal directory ('' = the system's) $2 the match; then
#: StartupWindow.args; then the anchors
JOURNAL_WINDOW_SCRIPT = r"""d=$1 m=$2 tn=$3 tw=$4 wm=$5 wr=$6; shift 6
c=$#; for a do set -- "$@" -e "$a"; done; shift "$c"
j() { if [ -n "$d" ]; then journalctl --no-pager -q --directory "$d" "$@"; else journalctl --no-pager -q "$@"; fi; }
if [ -z "$wr" ] || j "$m" -n "$tn" -o cat -a | awk -v w="$tw" '@TAIL@'; then j "$m" -o cat -a
else j "$m" -o cat -a | awk -v m="$wm" -v r="$wr" '@STOP@'; fi | grep -a -n -F "$@" | cut -c 1-@MAX_LINE@"""
JOURNAL_WINDOW_SCRIPT = (JOURNAL_WINDOW_SCRIPT.replace("@TAIL@", TAIL_AWK).replace("@STOP@", STOP_AWK)
                         .replace("@MAX_LINE@", str(MAX_LINE)))


@functools.lru_cache(maxsize=64)  # ~110 anchors quoted once per process, not once per host (issue 40)
def _grep_filter(anchors: tuple[bytes, ...]) -> str:
    argv = ["grep", "-a", "-n", "-F"]
    for a in anchors:
        argv += ["-e", a.decode("latin-1")]
    return shlex.join(argv) + " | " + shlex.join(["cut", "-c", f"1-{MAX_LINE}"])


@functools.lru_cache(maxsize=64)  # the same window and anchors for every host of an engine: quoted once (issue 40)
def _quoted_tail(args: tuple[str, ...], anchors: tuple[bytes, ...]) -> str:
    """A command's last words, shell-quoted: a startup window's arguments, then the anchors (~150 words)."""
    return shlex.join([*args, *(a.decode("latin-1") for a in anchors)])


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


def journal_lines(unit: str, invocation: str | None, directory: str | None, anchors: tuple[bytes, ...],
                  window: StartupWindow | None = None) -> str:
    """The lines of the unit's latest invocation (all its starts when there is no id). With a ``window`` and an
    invocation, read through the startup's ready line only (JOURNAL_WINDOW_SCRIPT)."""
    if invocation and window is not None and window.ready:
        head = shlex.join(["sh", "-c", JOURNAL_WINDOW_SCRIPT, "sh", directory or "",
                           f"_SYSTEMD_INVOCATION_ID={invocation}"])
        return f"{head} {_quoted_tail(window.args, anchors)}"  # a window's arguments are never empty
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


# --- the processes on the host (who holds the GPUs, where no cgroup names the engine's) -------------------------
#: ps's columns: the process, its parent, its state (T: stopped, Z: defunct) and its command line, which holds the
#: title an engine sets on its processes (sglang::scheduler_TP0, VLLM::Worker_TP0: setproctitle rewrites argv)
PS_FIELDS = "pid=,ppid=,stat=,args="
#: ps's table kept on the host to the rows that matter, each cut to its first three words (an engine's title, or
#: the program and what it runs; later arguments may hold secrets: --api-key): the processes $1 names (nvidia-smi's),
#: those whose first words hold one of the fragments in $2 (an engine's name), and every ancestor of those (so the
#: engine's start is found above its workers). One ps and one awk: no fork per process.
PS_SCRIPT = (
    "ps -e -ww -o " + PS_FIELDS + " | awk -v keep=\" $1 \" -v frags=\"$2\" '"
    "BEGIN { nf = split(frags, F, \" \") } "
    "{ t = $4; if (NF > 4) t = t \" \" $5; if (NF > 5) t = t \" \" $6; par[$1] = $2; "
    "row[$1] = $1 \" \" $2 \" \" $3 \" \" substr(t, 1, 200); l = tolower(t); hit = index(keep, \" \" $1 \" \") > 0; "
    "for (i = 1; i <= nf && !hit; i++) if (index(l, F[i])) hit = 1; if (hit) want[$1] = 1 } "
    "END { for (p in want) { q = p; while ((q in row) && !(q in out)) { out[q] = 1; q = par[q] } } "
    "for (q in out) print row[q] }'"
)
#: /proc/meminfo's lines kvaudit reads (the page cache on a unified-memory host), and each GPU process's resident
#: and swapped-out memory from /proc/PID/status
MEMINFO_KEYS = ("MemTotal:", "MemAvailable:", "Buffers:", "Cached:", "Shmem:", "SwapTotal:", "SwapFree:")
STATUS_KEYS = ("VmRSS:", "VmSwap:")
#: the most GPU processes whose /proc/PID/status is read (nvidia-smi lists one per rank and tenant)
MAX_STATUS_PIDS = 64


def process_list(pids: tuple[int, ...], fragments: tuple[str, ...]) -> str:
    return shlex.join(["sh", "-c", PS_SCRIPT, "sh", " ".join(map(str, pids[:MAX_STATUS_PIDS])), " ".join(fragments)])


def process_memory(pids: tuple[int, ...]) -> str:
    argv = ["grep", "-H"]
    for k in MEMINFO_KEYS + STATUS_KEYS:
        argv += ["-e", "^" + k]
    return shlex.join(argv + ["--", "/proc/meminfo", *(f"/proc/{p}/status" for p in pids[:MAX_STATUS_PIDS])])


def journal_pid(unit: str, invocation: str | None, directory: str | None) -> str:
    """The process that wrote the start's latest journal line (its ``_PID``: the engine's main process)."""
    match = [f"_SYSTEMD_INVOCATION_ID={invocation}"] if invocation else [f"--unit={unit}"]
    return shlex.join(_journal_base(directory) + match + ["-n", "1", "-o", "export", "--output-fields=_PID"])


def docker_pid(name: str) -> str:
    return shlex.join(["docker", "inspect", "-f", "{{.State.Pid}}", "--", name])


def read_config(path: str) -> str:
    return shlex.join(["head", "-c", str(CONFIG_MAX_BYTES), "--", path])


def hf_snapshots(model_id: str) -> str:
    return shlex.join(["sh", "-c", HF_SNAPSHOT_SCRIPT, "sh", model_id.replace("/", "--")])


def hostname() -> str:
    return "hostname"


# --- what the user may hand the builders -------------------------------------------------------------------
# A unit name or journal directory comes from the command line or an inventory: one the gate would refuse is
# the user's input, said as such before anything runs (the gate's refusal stays a kvaudit bug).

def printable_repr(text: str) -> str:
    """A user's value in a message: its repr (escapes shown, not sent to the terminal), cut."""
    return repr(text[:120])


_UNIT_NAME = re.compile(r"[^\s\x00-\x1f\x7f-\x9f]{1,255}")


def setting_problem(unit: str | None, journal_directory: str | None, source: str | None = None) -> str | None:
    """Why a --unit, --journal-directory or --source cannot be passed to a host command, or None (one host's
    inventory variable with a newline was a command the gate refused: exit 70 for the whole fleet)."""
    if source is not None and (any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f for c in source) or len(source) > 4096):
        return (f"--source {printable_repr(source)}: a docker:NAME or file:PATH without newlines or control "
                "characters")
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
_DOCKER_TIME = re.compile(r"[0-9T:.+\-Z]{1,64}")


def is_invocation_id(text: str) -> bool:
    """A systemd invocation id as systemd prints it (32 lower-case hex digits): what the gate lets through."""
    return _HEX32.fullmatch(text) is not None


def is_docker_time(text: str) -> bool:
    """A ``docker logs --since`` value the gate lets through."""
    return _DOCKER_TIME.fullmatch(text) is not None


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
                    {"--unit": _ANY_LINE, "--output-fields": re.compile(r"_SYSTEMD_INVOCATION_ID|_PID")},
                    positional=re.compile(r"_SYSTEMD_INVOCATION_ID=[0-9a-f]{32}"))


def _systemctl(args: list[str]) -> bool:
    if args[:1] == ["list-units"]:
        return args[1:] == ["--type=service", "--all", "--no-legend", "--plain", "--no-pager"]
    if args[:1] == ["show"]:
        return (len(args) == 6 and args[1] == "-p" and args[2] in ("InvocationID", "ControlGroup")
                and args[3] == "--value" and args[4] == "--")
    return False


_STATUS_FILE = re.compile(r"/proc/[1-9][0-9]{0,9}/status")


def _grep(args: list[str]) -> bool:
    if args[:1] == ["-H"]:  # process_memory: fixed keys, /proc/meminfo and /proc/PID/status files only
        keys = [x for k in MEMINFO_KEYS + STATUS_KEYS for x in ("-e", "^" + k)]
        files = args[len(keys) + 3:]
        return (args[1:len(keys) + 3] == keys + ["--", "/proc/meminfo"] and len(files) <= MAX_STATUS_PIDS
                and all(_STATUS_FILE.fullmatch(f) for f in files))
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
        return _options(args[1:], set(), {"--since": _DOCKER_TIME}, {}, after_dashdash=1)
    if args[:1] == ["inspect"]:
        return len(args) == 5 and args[1] == "-f" and args[2] in ("{{.State.StartedAt}}", "{{.State.Pid}}") \
            and args[3] == "--"
    return False


def _nvidia_smi(args: list[str]) -> bool:
    return args in ([f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"],
                    [f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])


def _head(args: list[str]) -> bool:
    return len(args) == 4 and args[:2] == ["-c", str(CONFIG_MAX_BYTES)] and args[2] == "--"


_PID_LIST = re.compile(r"(?:[1-9][0-9]{0,9}(?: (?=[1-9])|$)){0,64}")
_FRAGMENT_LIST = re.compile(r"(?:[a-z0-9._-]{1,64}(?: (?=[a-z0-9._-])|$)){0,32}")


def _sh(args: list[str]) -> bool:
    if len(args) >= 12 and args[:3] == ["-c", HOST_SCRIPT, "sh"]:
        return _host_script_args(args[3:])
    if len(args) >= 9 and args[:3] == ["-c", JOURNAL_WINDOW_SCRIPT, "sh"]:
        directory, match = args[3], args[4]
        return ((not directory or setting_problem(None, directory) is None)
                and _INVOCATION_MATCH.fullmatch(match) is not None and _window_args_ok(args[5:9]))
    if len(args) == 5 and args[:3] == ["-c", PS_SCRIPT, "sh"]:
        return _PID_LIST.fullmatch(args[3]) is not None and _FRAGMENT_LIST.fullmatch(args[4]) is not None
    return len(args) == 4 and args[0] == "-c" and args[1] in SCRIPTS and args[2] == "sh"


_NONCE = re.compile(r"[0-9a-f]{16}")
_INVOCATION_MATCH = re.compile(r"_SYSTEMD_INVOCATION_ID=[0-9a-f]{32}")


def _window_args_ok(args: list[str]) -> bool:
    """StartupWindow.args: the tail's line count, its words, the markers, the ready lines (data to awk's -v)."""
    return (len(args) == 4 and _TAIL_LINES.fullmatch(args[0]) is not None and _WINDOW_WORDS.fullmatch(args[1])
            is not None and _WINDOW_PAIRS.fullmatch(args[2]) is not None
            and _WINDOW_PAIRS.fullmatch(args[3]) is not None)
_SECONDS = re.compile(r"[1-9][0-9]{0,4}")
_FRAGMENT = re.compile(r"[a-z0-9._-]{1,64}")


def _host_script_args(args: list[str]) -> bool:
    """The host script's positional parameters, each of the kind its place takes (they are data to the script,
    quoted where it uses them; this keeps the gate as exact as for every other command)."""
    nonce, kind, unit, directory, source, model, cap, k = args[:8]
    if not (_NONCE.fullmatch(nonce) and kind in SCRIPT_KINDS and cap.isdigit() and k.isdigit()):
        return False
    if unit and (not _UNIT_NAME.fullmatch(unit) or kind not in ("journal", "dir")):
        return False
    if (kind == "dir") != bool(directory) or (directory and setting_problem(None, directory)):
        return False
    if (kind in ("docker", "file")) != bool(source) or "\n" in source or "\n" in model:
        return False
    fragments = args[8:8 + int(k)]
    smi = args[8 + int(k)] if len(args) > 8 + int(k) else ""
    return (len(fragments) == int(k) and all(_FRAGMENT.fullmatch(f) for f in fragments)
            and _SECONDS.fullmatch(smi) is not None and _window_args_ok(args[9 + int(k):13 + int(k)]))


_PROGRAMS = {
    "journalctl": _journalctl, "systemctl": _systemctl, "grep": _grep, "cut": _cut, "docker": _docker,
    "nvidia-smi": _nvidia_smi, "head": _head, "sh": _sh, "hostname": lambda args: not args,
}


#: what _stages steps over at a time outside quotes: a run of plain characters, a quoted string (a double-quoted one
#: with its backslash escapes), a backslash and the character it escapes, the pipe `` | ``, or one character (a lone
#: quote here is one left open: no closing quote follows it)
_TOKEN = re.compile(r"""[^'"\\ ]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.?| \| |.""", re.S)


def _stages(command: str) -> list[str] | None:
    """The pipeline's stages: split at each `` | `` outside quotes (a model path may hold `` | ``; quoted by
    ``shlex.join`` it is one argument, not a pipe). None when a quote is left open."""
    stages, start = [], 0
    for m in _TOKEN.finditer(command):
        tok = m.group()
        if tok == " | ":
            stages.append(command[start:m.start()])
            start = m.end()
        elif tok in ("'", '"'):
            return None
    stages.append(command[start:])
    return stages


def is_allowed(command: str) -> bool:
    """True when every stage of the pipeline is a read-only program from the list, with exactly the options
    kvaudit's builders use, and quoted exactly as ``shlex.join`` quotes it (so no unquoted ``;``, ``$(...)``,
    redirection or glob can hide in it). The host script's nonce is new for every host; the answer does not
    depend on which nonce it is (16 hex digits, quoted by nothing, checked only for its form), so the script is
    checked with a placeholder in its place and a fleet's hosts share one parse of it."""
    if command.startswith(_SCRIPT_HEAD):
        at = len(_SCRIPT_HEAD)
        nonce, rest = command[at:at + 16], command[at + 16:]
        if _NONCE.fullmatch(nonce) and rest[:1] in ("", " "):
            command = _SCRIPT_HEAD + _PLACEHOLDER_NONCE + rest
    return _is_allowed(command)


@functools.lru_cache(maxsize=4096)  # a fleet sends the same commands to every host
def _is_allowed(command: str) -> bool:
    stages = _stages(command)
    return stages is not None and all(_stage_allowed(stage, i == 0) for i, stage in enumerate(stages))


@functools.lru_cache(maxsize=4096)  # a host's journal_lines differs from the next one's only in its first stage
def _stage_allowed(stage: str, first: bool) -> bool:
    if first and stage.startswith("docker logs ") and stage.endswith(" 2>&1"):
        stage = stage[: -len(" 2>&1")]  # docker writes the container's stderr to its own stderr
    argv = _joined_words(stage)
    return argv is not None and shlex.join(argv) == stage and _argv_ok(argv)  # _JOINED holds a word at least


#: one word as ``shlex.quote`` writes it: plain (its safe characters) or single-quoted, a single quote inside as
#: '"'"' (the form of ``quote``'s output; anything else in a stage is not one of kvaudit's commands)
_WORD = r"""[\w@%+=:,./-]+|'[^']*'(?:"'"'[^']*')*"""
_JOINED = re.compile(rf"(?:{_WORD})(?: (?:{_WORD}))*", re.ASCII)
_WORDS = re.compile(_WORD, re.ASCII)


def _joined_words(stage: str) -> list[str] | None:
    """The words of a stage written as ``shlex.join`` writes them, as ``shlex.split`` reads them; None when it is not
    in that form. One regex pass: ``shlex.split`` reads a character at a time in Python (the host script's ~370
    words, ~2 ms a host whose script's arguments differ from the last host's: issue 40)."""
    if _JOINED.fullmatch(stage) is None:
        return None
    return [w if w[0] != "'" else w[1:-1].replace("'\"'\"'", "'") for w in _WORDS.findall(stage)]


# --- the whole collection in one exec -----------------------------------------------------------------------
# Every command above is a round trip of its own, and several depend on the one before (the unit, then its
# invocation, then its lines; the config.json whose path is in the lines). HOST_SCRIPT runs the same commands,
# with the same options, on the host in one exec and one login shell, taking each decision the session would
# take from their outputs: it is fixed text, and every value (unit, directory, path, anchors) reaches it as a
# positional parameter, used quoted, never as code. Each command's output is framed on stdout, and its stderr
# on stderr, by marker lines carrying a random nonce and naming the command by its kind and arguments; the
# session rebuilds each command with the builders above and keeps the output as that command's result, so that
# its own logic runs unchanged on them. A decision the script took differently (or a part it did not reach, or
# framing a hostile host broke) only means a command the session asks for is not among them: it then runs on
# its own, as before. The config.json candidates are the absolute paths and Hugging Face ids quoted by the
# selected lines that name a model (``model_path=``, ``'model':``, ``models--org--name``: every engine's line that
# says where the model is has the word): each is tried (a stat, no exec), and at most four config.json files are
# read; the session keeps only the one at the selected startup's model path, and only if it parses as a model config.
# The GPU readings come last: an nvidia-smi that hangs costs only itself (the parts before it are kept).
#
# $1 nonce  $2 kind: journal | dir | docker | file | none  $3 unit ('' = find it)  $4 journal directory
# $5 docker name or file path  $6 model path known beforehand (a pod's)  $7 bytes of lines kept
# $8 k, then k lower-case unit-name fragments; then the seconds each nvidia-smi may take (coreutils/BusyBox
# ``timeout``, where the host has it: a hung driver costs the readings, exit 124, never the audit); then
# StartupWindow.args (an invocation's read stops at its startup's ready line: JOURNAL_WINDOW_SCRIPT); the rest:
# the anchors
_HOST_SCRIPT = r"""n=$1 kind=$2 unit=$3 dir=$4 src=$5 model=$6 cap=$7 k=$8; shift 8
frags=; while [ "$k" -gt 0 ]; do frags="$frags $1"; shift; k=$((k-1)); done
st=$1 tn=$2 tw=$3 wm=$4 wr=$5; shift 5
c=$#; for a do set -- "$@" -e "$a"; done; shift "$c"
set -f; nl='
'; IFS=$nl; exec 3>&1
open() { j=$1; shift; printf '\n@@%s begin' "$n"; while [ "$j" -gt 0 ]; do printf '\t%s' "$1"; shift; j=$((j-1)); done
  printf '\n'; printf '\n@@%s begin\n' "$n" >&2; }
close() { printf '\n@@%s end %s\n' "$n" "$1"; printf '\n@@%s end\n' "$n" >&2; }
val() { open "$@"; shift "$(($1+1))"; out=$("$@"; printf ' %s' "$?"); rc=${out##* }; out=${out% *}; printf '%s' "$out"
  close "$rc"; }
flow() { open "$@"; shift "$(($1+1))"; "$@"; close "$?"; }
lines() { open "$@"; shift "$(($1+1))"
  cands=$( { "$@" | head -c "$cap" | tee /dev/fd/4 >&3; } 4>&1 | grep -aiF -e model \
    | grep -aoE -e "['\"=: (]/[A-Za-z0-9._@+~/-]+" \
    -e "'[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+'" | awk 'c < 64 && !s[$0]++ { c++; print }'); close 0; }
hexid() { v=${1%%[!0-9a-f]*}; case $v in ????????????????????????????????) printf '%s' "$v";; esac; }
pick() { printf '%s\n' "$1" | awk -v f="$frags" -v sys="$2" 'BEGIN { nf = split(f, F, " ") }
  { x = $1; if (x == "" || (sys && x !~ /\.service$/)) next; l = tolower(x); hit = 0
    for (i = 1; i <= nf; i++) if (index(l, F[i])) hit = 1
    if (hit) { if (sys && $3 == "active") run[x] = 1; else idle[x] = 1 } }
  END { for (x in run) { print x; r = 1 } if (!r) for (x in idle) print x }'; }
jbase() { if [ -n "$dir" ]; then journalctl --no-pager -q --directory "$dir" "$@"
  else journalctl --no-pager -q "$@"; fi; }
filter() { grep -a -n -F "$@" | cut -c 1-@MAX_LINE@; }
jread() { m=$1; shift; jbase "$m" -o cat -a | filter "$@"; }
jwin() { m=$1; shift
  if [ -z "$wr" ] || jbase "$m" -n "$tn" -o cat -a | awk -v w="$tw" '@TAIL@'; then jbase "$m" -o cat -a
  else jbase "$m" -o cat -a | awk -v m="$wm" -v r="$wr" '@STOP@'; fi | filter "$@"; }
dread() { s=$1; shift; if [ -n "$s" ]; then docker logs --since "$s" -- "$src" 2>&1 | filter "$@"
  else docker logs -- "$src" 2>&1 | filter "$@"; fi; }
fread() { grep -a -n -F "$@" -- "$src" | cut -c 1-@MAX_LINE@; }
hub() { printf '%s' "${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}/models--$1/snapshots"; }
snaps() { set +f; for d in "$(hub "$1")"/*/; do [ -f "$d/config.json" ] && echo "$d"; done; return 0; }
smi() { if command -v timeout >/dev/null 2>&1; then timeout -k 1 "$st" nvidia-smi "$@"; else nvidia-smi "$@"; fi; }
pslist() { @PS_SCRIPT@; }
procs() { for f in "/sys/fs/cgroup$1/cgroup.procs" "/sys/fs/cgroup/systemd$1/cgroup.procs"; do
  if [ -r "$f" ]; then cat "$f"; return; fi; done; return 0; }
val 1 hostname hostname
cands= cg= inv=
case $kind in
journal|dir)
  if [ -z "$unit" ]; then
    if [ "$kind" = journal ]; then
      val 1 units systemctl list-units --type=service --all --no-legend --plain --no-pager
      [ "$rc" = 0 ] && unit=$(pick "$out" 1)
    fi
    if [ -z "$unit" ]; then val 1 junits jbase -F _SYSTEMD_UNIT; [ "$rc" = 0 ] && unit=$(pick "$out" ""); fi
    case $unit in *"$nl"*) unit=;; esac
  fi
  if [ -n "$unit" ]; then
    if [ "$kind" = journal ]; then
      val 2 inv "$unit" systemctl show -p InvocationID --value -- "$unit"; [ "$rc" = 0 ] && inv=$(hexid "$out")
      val 2 cg "$unit" systemctl show -p ControlGroup --value -- "$unit"; [ "$rc" = 0 ] && cg=${out%%"$nl"*}
    fi
    if [ -z "$inv" ]; then
      val 2 lastinv "$unit" jbase "--unit=$unit" -n 1 -o export --output-fields=_SYSTEMD_INVOCATION_ID
      case $out in *"${nl}_SYSTEMD_INVOCATION_ID="*) inv=$(hexid "${out#*"${nl}"_SYSTEMD_INVOCATION_ID=}");; esac
    fi
    if [ -n "$inv" ]; then lines 3 lines "$unit" "$inv" jwin "_SYSTEMD_INVOCATION_ID=$inv" "$@"
    else lines 3 lines "$unit" "" jread "--unit=$unit" "$@"; fi
    [ -n "$cg" ] && val 2 pids "$cg" procs "$cg"
    if [ -n "$inv" ]; then m="_SYSTEMD_INVOCATION_ID=$inv"; else m="--unit=$unit"; fi
    val 3 jpid "$unit" "$inv" jbase "$m" -n 1 -o export --output-fields=_PID
  fi;;
docker)
  val 2 dstart "$src" docker inspect -f '{{.State.StartedAt}}' -- "$src"
  if [ "$rc" = 0 ]; then since=${out%%"$nl"*}; lines 3 dlines "$src" "$since" dread "$since" "$@"
    val 2 dpid "$src" docker inspect -f '{{.State.Pid}}' -- "$src"; fi;;
file) lines 2 flines "$src" fread "$@";;
esac
[ -n "$model" ] && cands="$model$nl$cands"
nread=0
for x in $cands; do
  p= id=
  case $x in
  /*) p=$x;;
  "'"[!/]*"'") id=${x#"'"}; id=${id%"'"};;
  ?/*) p=${x#?};;
  ?*/?*) id=$x;;
  esac
  p=${p%/}
  if [ -n "$p" ] && [ "$nread" -lt 4 ] && [ -f "$p/config.json" ]; then
    nread=$((nread+1)); flow 2 config "$p/config.json" head -c @CONFIG_MAX@ -- "$p/config.json"
  elif [ -n "$id" ] && [ "$nread" -lt 4 ] && [ -d "$(hub "${id%%/*}--${id#*/}")" ]; then
    val 2 hf "$id" snaps "${id%%/*}--${id#*/}"
    for s in $out; do
      [ "$nread" -lt 4 ] || break
      nread=$((nread+1)); flow 2 config "${s%/}/config.json" head -c @CONFIG_MAX@ -- "${s%/}/config.json"
    done
  fi
done
val 1 gpus smi --query-gpu=@GPU_FIELDS@ --format=csv,noheader,nounits
[ "$rc" = 124 ] || val 1 apps smi --query-compute-apps=@APP_FIELDS@ --format=csv,noheader,nounits
pl= sf= np=0; [ "$rc" = 0 ] && for x in $out; do p=${x%%,*}; case $p in ''|0*|*[!0-9]*) continue;; esac
  [ "$np" -lt @MAX_PIDS@ ] && case " $pl " in *" $p "*) ;;
  *) pl="${pl:+$pl }$p" sf="$sf$nl/proc/$p/status" np=$((np+1));; esac; done
fr=${frags# }; flow 3 ps "$pl" "$fr" pslist "$pl" "$fr"
val 2 pmem "$pl" grep -H@MEM_KEYS@ -- /proc/meminfo $sf
exit 0"""
HOST_SCRIPT: str = (_HOST_SCRIPT.replace("@GPU_FIELDS@", ",".join(GPU_FIELDS))
                    .replace("@APP_FIELDS@", ",".join(APP_FIELDS)).replace("@MAX_LINE@", str(MAX_LINE))
                    .replace("@CONFIG_MAX@", str(CONFIG_MAX_BYTES)).replace("@PS_SCRIPT@", PS_SCRIPT)
                    .replace("@MAX_PIDS@", str(MAX_STATUS_PIDS))
                    .replace("@MEM_KEYS@", "".join(f" -e '^{k}'" for k in MEMINFO_KEYS + STATUS_KEYS))
                    .replace("@TAIL@", TAIL_AWK).replace("@STOP@", STOP_AWK))


#: the host script's command up to its nonce, as :func:`host_script` writes it, and the nonce :func:`is_allowed`
#: checks it with
_SCRIPT_HEAD = shlex.join(["sh", "-c", HOST_SCRIPT, "sh"]) + " "
_PLACEHOLDER_NONCE = "0" * 16


def host_script(nonce: str, kind: str, unit: str | None, directory: str | None, source: str | None,
                model: str | None, cap: int, fragments: tuple[str, ...], anchors: tuple[bytes, ...],
                smi_timeout: int = SMI_TIMEOUT_S, window: StartupWindow | None = None) -> str:
    """The one exec that collects everything (see HOST_SCRIPT)."""
    words = shlex.join([nonce, kind, unit or "", directory or "", source or "", model or "", str(cap),
                        str(len(fragments)), *fragments, str(max(1, min(99_999, int(smi_timeout))))])
    return f"{_SCRIPT_HEAD}{words} {_quoted_tail((window or StartupWindow()).args, anchors)}"


#: how a command that is the host script begins, for naming it (a name of its own: is_allowed's _SCRIPT_HEAD, the
#: head up to the nonce, was once shadowed by this one, and no host's gate ever hit the cache)
_SHOWN_HEAD = shlex.join(["sh", "-c", HOST_SCRIPT])[:60]


def shown(command: str, limit: int = 80) -> str:
    """A command as a message names it: the host script by what it is (its text, 3 KB of shell, helps nobody in a
    health-check headline or a fleet report), any other command by its first ``limit`` characters."""
    if command.startswith(_SHOWN_HEAD):
        return "kvaudit's collection script (the log, the config, nvidia-smi: one exec)"
    return command[:limit]
