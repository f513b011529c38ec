"""What a collector hands on: the host's filtered log lines, its GPU readings, the model config, and a record
of every command it ran. Frozen; no parsing of engine lines happens here."""

from __future__ import annotations

from dataclasses import field
from typing import Protocol

from kvaudit.record import record

#: how the partial sentences begin for what could not be read (the session writes them; ignores.STATES and the
#: health check recognise them by these beginnings)
NO_CONFIG = "no config.json"
SMI_MISSING = "nvidia-smi not found"
SMI_FAILED = "nvidia-smi failed"


class CollectError(Exception):
    """A host could not be audited. ``reason`` is a stable word fleet reports and exit codes use.
    ``collected``: what was read from the host before the failure (GPU readings, processes, the commands run),
    when anything was: a report still shows it."""

    reason = "error"
    collected: "Collected | None" = None


class Unreachable(CollectError):
    reason = "unreachable"  # refused, no route, DNS, connect or banner timeout


class HostTimeout(CollectError):
    reason = "timeout"  # the per-host deadline passed while commands ran


class ConnectionDropped(CollectError):
    reason = "dropped"  # the connection closed in the middle of a command's output


class AuthFailed(CollectError):
    reason = "auth"


class HostKeyRefused(CollectError):
    reason = "host_key"  # unknown (without --accept-new-host-key) or changed


class CommandRefused(CollectError):
    reason = "refused_command"  # the read-only gate refused a command kvaudit built: a bug, never the host's doing


class BadSetting(CollectError):
    reason = "bad_setting"  # a --unit or --journal-directory no host command can take (the user's input, not a bug)


class NoEngineFound(CollectError):
    reason = "no_engine"


class JournalDenied(CollectError):
    reason = "journal_denied"  # the login user may not read the system journal: a permission, not a missing engine


@record
class CommandResult:
    command: str  # exactly what ran, shell-quoted
    rc: int | None  # None when the command did not finish
    stdout: bytes = field(repr=False)
    stderr: bytes = field(repr=False)
    seconds: float
    truncated: bool = False  # output hit the size limit
    unreached: bool = False  # part of a batch that stopped before this command ran: run it again on its own


@record
class CommandRecord:
    """What a report and a capture keep of a command: no output, just the facts."""

    command: str
    rc: int | None
    bytes_received: int
    seconds: float
    truncated: bool = False


@record
class GpuReading:
    """One GPU as NVML or nvidia-smi saw it. MiB throughout (nvidia-smi's unit); None when not reported."""

    index: int
    uuid: str
    name: str
    bus_id: str
    total_mib: float | None
    reserved_mib: float | None
    used_mib: float | None
    free_mib: float | None
    driver: str | None = None


@record
class ComputeApp:
    pid: int
    gpu_uuid: str
    name: str
    used_mib: float | None


@record
class HostProcess:
    """A process on the audited host that matters to its GPUs: one nvidia-smi lists, one whose title is an
    engine's, or one of the engine's start (``ps``; memory from /proc/PID/status, MiB, where read)."""

    pid: int
    ppid: int
    state: str  # ps's STAT: R running, S sleeping, D waiting on I/O, T stopped, Z defunct (+ flags)
    title: str  # its command line's first words, printable (setproctitle's title: sglang::scheduler_TP0)
    rss_mib: float | None = None
    swap_mib: float | None = None


@record
class Collected:
    """Everything read from one host for one audit."""

    target: str  # as the user named it
    host: str | None  # the host's own name (hostname), when read
    source: str  # "journal unit=sglang.service invocation=...", "docker:NAME", "file:PATH", "capture:DIR"
    log_lines: tuple[tuple[int, str], ...]  # (line number, text) already filtered on the host
    gpus: tuple[GpuReading, ...]
    apps: tuple[ComputeApp, ...]
    config_json: str | None
    config_source: str | None
    server_pids: tuple[int, ...]  # the engine's processes (the unit's cgroup), when known
    commands: tuple[CommandRecord, ...]
    partial: tuple[str, ...]  # what could not be read, one sentence each
    collected_at: str  # ISO 8601, UTC
    unit: str | None = None
    invocation_id: str | None = None
    gpu_source: str | None = None  # "nvidia-smi" | "nvml" | None
    #: a pod target's namespace and container, and the pod each GPU reading came from (in ``gpus`` order; a group's
    #: GPUs are numbered on across its pods): the labels its Prometheus series carry
    pod_namespace: str | None = None
    pod_container: str | None = None
    pods: tuple[str, ...] = ()
    gpu_pods: tuple[str, ...] = ()
    #: the host's processes that matter to its GPUs (see HostProcess), and /proc/meminfo's lines in MiB
    #: (MemTotal, Cached, ...), where read; ``start_pids``: the engine's start as its log names it (the journal's
    #: _PID, a syslog prefix's python3[48190], a container's init), before its children are added
    processes: tuple[HostProcess, ...] = ()
    meminfo_mib: tuple[tuple[str, float], ...] = ()
    start_pids: tuple[int, ...] = ()

    @property
    def bytes_received(self) -> int:
        return sum(c.bytes_received for c in self.commands)


class Runner(Protocol):
    """Runs one read-only shell command on a host and returns its output (bounded)."""

    def run(self, command: str, timeout: float, max_bytes: int) -> CommandResult: ...

    def run_batch(self, commands: list[str], timeout: float, max_bytes: int) -> list[CommandResult]:
        """Run independent commands together (one round trip where the transport allows)."""
        ...

    def close(self) -> None: ...
