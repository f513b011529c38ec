"""The fixed list of read-only commands kvaudit runs on an audited host.

Nothing here writes: each builder returns a shell string made from argv with every argument quoted
(``shlex.join``), so a hostile unit or container name reaches the host as one literal argument. The only
shell scripts are the constants below, which take user input as positional parameters, never as code.
:func:`is_allowed` is the gate every collector passes its commands through; tests hold it to that.
"""

from __future__ import annotations

import functools
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

READ_ONLY = {
    "systemctl": {"show", "list-units"},
    "journalctl": None,  # any flags: journalctl only reads
    "grep": None,
    "cut": None,
    "docker": {"logs", "inspect"},
    "nvidia-smi": None,
    "head": None,
    "hostname": None,
    "sh": None,  # only with one of SCRIPTS (checked below)
}
FORBIDDEN_FLAGS = {
    "journalctl": {"--vacuum-size", "--vacuum-time", "--vacuum-files", "--rotate", "--flush", "--sync",
                   "--relinquish-var", "--smart-relinquish-var", "--setup-keys", "--update-catalog", "--cursor-file"},
    "nvidia-smi": {"-r", "--gpu-reset", "-pm", "--persistence-mode", "-e", "--ecc-config", "-c",
                   "--compute-mode", "-pl", "--power-limit", "-ac", "-rac", "-lgc", "-rgc", "-mig"},
}


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


NO_ARGS = {"hostname"}  # hostname with an argument would set it


@functools.lru_cache(maxsize=4096)  # a fleet sends the same commands to every host
def is_allowed(command: str) -> bool:
    """True when every stage of the pipeline is a read-only program from the list, used read-only, and
    quoted exactly as ``shlex.join`` quotes it (so no unquoted ``;``, ``$(...)``, redirection or glob can
    hide in it)."""
    stages = command.split(" | ")
    for i, stage in enumerate(stages):
        if i == 0 and stage.startswith("docker logs ") and stage.endswith(" 2>&1"):
            stage = stage[: -len(" 2>&1")]  # docker writes the container's stderr to its own stderr
        try:
            argv = shlex.split(stage)
        except ValueError:
            return False
        if not argv or shlex.join(argv) != stage:
            return False
        prog = argv[0]
        if prog not in READ_ONLY:
            return False
        if prog in NO_ARGS and len(argv) > 1:
            return False
        subs = READ_ONLY[prog]
        if subs is not None and (len(argv) < 2 or argv[1] not in subs):
            return False
        if prog == "sh" and (len(argv) < 3 or argv[1] != "-c" or argv[2] not in SCRIPTS):
            return False
        bad = FORBIDDEN_FLAGS.get(prog, set())
        if any(a.split("=", 1)[0] in bad for a in argv[1:]):
            return False
    return True
