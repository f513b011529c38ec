"""Collecting from one host through a Runner: find the engine's unit and its latest start, pull that start's
memory lines (filtered on the host, so only they cross the network), the GPUs' readings and the model
config. Every command goes through :func:`kvaudit.collect.commands.is_allowed` and is recorded."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

from kvaudit.collect import commands as C
from kvaudit.collect.interface import (
    Collected,
    CollectError,
    CommandRefused,
    CommandRecord,
    CommandResult,
    ComputeApp,
    GpuReading,
    HostProcess,
    HostTimeout,
    JournalDenied,
    NoEngineFound,
    Runner,
    NO_CONFIG,
    SMI_FAILED,
    SMI_MISSING,
)
from kvaudit.collect.ssh import BATCH_MAX_BYTES
from kvaudit.collect.nvidia_smi import SmiParseError, parse_apps, parse_gpus
from kvaudit.textsafe import printable
from kvaudit.record import record

#: unit names that look like some inference engine (the audited engines' own names come in CollectOptions)
#: how the partial-data notes about a missing model config begin (a log that states bytes per token needs none)
GENERIC_ENGINE_UNIT = ("lmdeploy", "text-generation", "tgi", "trtllm", "tensorrt", "llm", "inference")


@record
class CollectOptions:
    anchors: tuple[bytes, ...]
    unit: str | None = None
    source: str | None = None  # None (systemd journal) | "docker:NAME" | "file:PATH"
    journal_directory: str | None = None
    command_timeout: float = 60.0
    max_output: int = 64 << 20
    engine_names: tuple[str, ...] = ()  # unit-name fragments of the engines kvaudit audits
    window: C.StartupWindow | None = None  # where a startup ends: an invocation's read stops there (speed)

    @property
    def unit_fragments(self) -> tuple[str, ...]:
        """What an engine's unit name contains (lower case): the session's pattern, and the host script's."""
        return tuple(dict.fromkeys(n.lower() for n in self.engine_names + GENERIC_ENGINE_UNIT))

    @property
    def unit_pattern(self) -> "re.Pattern[str]":
        return re.compile("|".join(re.escape(n) for n in self.unit_fragments), re.I)


@dataclass
class HostSession:
    runner: Runner
    target: str
    opts: CollectOptions
    records: list[CommandRecord] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    raw: dict[str, bytes] = field(default_factory=dict)  # outputs a capture keeps
    unit: str | None = None
    invocation: str | None = None
    source_desc: str = ""
    host: str | None = None
    cache: dict[str, CommandResult] = field(default_factory=dict)  # prefetched results

    def _gate(self, command: str) -> None:
        if not C.is_allowed(command):  # a programming error, never user input: refuse loudly
            raise CommandRefused(f"kvaudit refused to run a command that is not on its read-only list (a bug in "
                                 f"kvaudit; nothing was run on the host): {C.shown(command, 200)}")

    def _record(self, res: CommandResult) -> None:
        self.records.append(CommandRecord(res.command, res.rc, len(res.stdout) + len(res.stderr),
                                          round(res.seconds, 3), res.truncated))

    def run(self, command: str, timeout: float | None = None) -> CommandResult:
        if command in self.cache:
            return self.cache[command]
        self._gate(command)
        res = self.runner.run(command, timeout or self.opts.command_timeout, self.opts.max_output)
        self._record(res)
        return res

    def prefetch(self, commands: list[str]) -> None:
        """Run commands that will be needed together, in one round trip; later run() calls get the results."""
        todo = [c for c in dict.fromkeys(commands) if c not in self.cache]
        for c in todo:
            self._gate(c)
        if not todo:
            return
        for res in self.runner.run_batch(todo, self.opts.command_timeout, self.opts.max_output):
            if res.unreached:  # the batch stopped early (a loaded host, a dropped shell): run() retries it alone
                continue
            self.cache[res.command] = res
            self._record(res)

    def prefetch_start(self) -> None:
        """Round trip 1: everything that needs nothing else: the host name, unit candidates, GPU readings."""
        first = [C.hostname(), C.query_gpus(), C.query_apps()]
        if not self.opts.source:
            if self.opts.journal_directory:
                if self.opts.unit:
                    first.append(C.last_invocation_in_journal(self.opts.unit, self.opts.journal_directory))
                else:
                    first.append(C.journal_units(self.opts.journal_directory))
            elif self.opts.unit:
                first += [C.invocation_id(self.opts.unit), C.control_group(self.opts.unit)]
            else:
                first.append(C.list_units())
        self.prefetch(first)

    def prefetch_host(self, model_path: str | None = None, read_log: bool = True) -> None:
        """The whole collection in one exec (:data:`~kvaudit.collect.commands.HOST_SCRIPT`): the host name, the
        unit and its latest invocation, that start's lines, the unit's processes, the config.json files the
        lines quote, the GPU readings. Each part is kept as the result of the command it is (rebuilt here by the
        same builders), so the steps after ask for them as before and find them; a part the script did not
        reach, or decided differently about, runs on its own when asked for."""
        o = self.opts
        src = o.source or ""
        kind = ("none" if not read_log else "docker" if src.startswith("docker:") else "file"
                if src.startswith("file:") else "dir" if o.journal_directory else "journal")
        nonce = secrets.token_hex(8)
        script = C.host_script(nonce, kind, o.unit if kind in ("journal", "dir") else None, o.journal_directory
                               if kind == "dir" else None, src.partition(":")[2] or None, model_path,
                               o.max_output + 1, o.unit_fragments, o.anchors, smi_timeout=self._smi_timeout(),
                               window=o.window)
        self._gate(script)
        limit = o.max_output + 1 + 4 * C.CONFIG_MAX_BYTES + BATCH_MAX_BYTES
        res = self.runner.run(script, 2 * o.command_timeout, limit)
        for part in script_parts(res, nonce.encode()):
            command = self._command_of(part.kind, part.args)
            if command is None or command in self.cache:
                continue
            out, truncated = part.stdout, res.truncated and part.rc is None
            if part.kind in ("lines", "dlines", "flines") and len(out) > o.max_output:
                out, truncated = out[:o.max_output], True  # as the runner cuts a command's output
            got = CommandResult(command, part.rc, out, part.stderr, part.seconds, truncated)
            self.cache[command] = got
            self._record(got)

    def _command_of(self, kind: str, args: tuple[str, ...]) -> str | None:
        """The command a part of the host script's output is the output of, as the builders write it."""
        o, d = self.opts, self.opts.journal_directory
        one = args[0] if args else ""
        build = {
            "hostname": lambda: C.hostname(), "gpus": lambda: C.query_gpus(), "apps": lambda: C.query_apps(),
            "units": lambda: C.list_units(), "junits": lambda: C.journal_units(d),
            "inv": lambda: C.invocation_id(one), "cg": lambda: C.control_group(one),
            "lastinv": lambda: C.last_invocation_in_journal(one, d),
            "lines": lambda: C.journal_lines(one, args[1] or None, d, o.anchors, o.window),
            "pids": lambda: C.cgroup_pids(one), "dstart": lambda: C.docker_started(one),
            "dlines": lambda: C.docker_lines(one, args[1] or None, o.anchors),
            "flines": lambda: C.file_lines(one, o.anchors), "hf": lambda: C.hf_snapshots(one),
            "config": lambda: C.read_config(one),
            "ps": lambda: C.process_list(_pids(one), tuple(args[-1].split())),
            "pmem": lambda: C.process_memory(_pids(one)),
            "jpid": lambda: C.journal_pid(one, args[1] or None, d), "dpid": lambda: C.docker_pid(one),
        }.get(kind)
        want = {"hostname": 0, "gpus": 0, "apps": 0, "units": 0, "junits": 0, "lines": 2, "dlines": 2, "ps": 2,
                "jpid": 2}.get(kind, 1)
        if build is None or len(args) != want:
            return None  # framing a host broke, or a part this kvaudit does not know: it runs on its own if asked
        command = build()
        return command if C.is_allowed(command) else None

    # --- log lines --------------------------------------------------------------------------------------
    def log_lines(self) -> list[tuple[int, str]]:
        src = self.opts.source
        if src and src.startswith("docker:"):
            return self._docker(src[7:])
        if src and src.startswith("file:"):
            path = src[5:]
            self.source_desc = f"file:{path}"
            res = self._read_log(C.file_lines(path, self.opts.anchors))
            why = _first_line(res.stderr) or f"rc {res.rc}"
            if not res.stdout.strip() and "No such file" in why:  # grep's complaint (the pipeline's rc is cut's)
                raise NoEngineFound(f"{self.target}: --source file:{path}: the file does not exist on the host")
            if res.rc not in (0, 1) or (res.rc == 1 and res.stderr.strip()):
                raise NoEngineFound(f"{self.target}: cannot read {path}: {why}")
            return self._lines(res)
        return self._journal()

    def _docker(self, name: str) -> list[tuple[int, str]]:
        started = self.run(C.docker_started(name))
        since = docker_since(started.stdout.decode(errors="replace")) if started.rc == 0 else None
        if started.rc != 0:
            raise NoEngineFound(f"{self.target}: docker container {name!r}: "
                                f"{_first_line(started.stderr) or _first_line(started.stdout) or f'rc {started.rc}'}")
        self.source_desc = f"docker:{name} (since {since})"
        return self._lines(self._read_log(C.docker_lines(name, since, self.opts.anchors)))

    def _journal(self) -> list[tuple[int, str]]:
        d = self.opts.journal_directory
        unit = self.opts.unit or self.discover_unit()
        self.unit = unit
        inv = None
        self.prefetch([C.last_invocation_in_journal(unit, d)] if d else [C.invocation_id(unit), C.control_group(unit)])
        if not d:
            res = self.run(C.invocation_id(unit))
            if res.rc == 0:
                said = res.stdout.decode(errors="replace").strip()
                # systemd prints 32 lower-case hex digits; anything else is no id (as the host script's hexid)
                inv = said if C.is_invocation_id(said) else None
        if inv is None:
            res = self.run(C.last_invocation_in_journal(unit, d))
            m = re.search(rb"^_SYSTEMD_INVOCATION_ID=([0-9a-f]{32})$", res.stdout, re.M)
            inv = m.group(1).decode() if m else None
            if res.rc not in (0, 1) and not res.stdout:
                raise NoEngineFound(f"{self.target}: cannot read the journal"
                                    f"{' in ' + d if d else ''}: {_first_line(res.stderr) or f'rc {res.rc}'}")
        self.invocation = inv
        which = f" invocation={inv}" if inv else " (no invocation id: all starts)"
        self.source_desc = f"journal unit={unit}{which}" + (f" directory={d}" if d else "")
        res = self._read_log(C.journal_lines(unit, inv, d, self.opts.anchors, self.opts.window))
        lines = self._lines(res)
        if not lines:
            denied = _journal_denied(res.stderr)
            if denied:
                raise JournalDenied(f"{self.target}: {denied}")
            if self.opts.unit:
                self._unit_exists(unit, d)
            why = _first_line(res.stderr)
            raise NoEngineFound(f"{self.target}: the journal of {unit} has no engine lines"
                                + (f" ({why})" if why else ""))
        return lines

    def _unit_exists(self, unit: str, directory: str | None) -> None:
        """``--unit`` named a unit the host (or the journal directory) does not have: say so, with the
        engine-like units it does have (systemd's list, or the journal's own when reading a directory)."""
        res = self.run(C.journal_units(directory) if directory else C.list_units())
        if res.rc != 0:
            return
        units = [line.split()[0] for line in res.stdout.decode(errors="replace").splitlines() if line.split()]
        if unit in units or unit + ".service" in units:
            return
        like = sorted(u for u in units if u.endswith(".service") and self.opts.unit_pattern.search(u))
        where = "in the journal" if directory else "on the host"
        raise NoEngineFound(f"{self.target}: there is no unit {unit!r} {where}; "
                            + (f"engine-like units there: {', '.join(like)}" if like else
                               "no engine-like unit there either (--source docker:NAME or file:PATH?)"))

    def _read_log(self, command: str) -> CommandResult:
        """The log read; one that ran out of time is a timeout, not a log without engine lines."""
        res = self.run(command)
        if res.rc is None and b"[kvaudit: timed out]" in res.stderr:
            raise HostTimeout(f"{self.target}: reading the log did not finish within "
                              f"{self.opts.command_timeout:g} s ({len(res.stdout):,} bytes received)")
        return res

    def discover_unit(self) -> str:
        names: list[str] = []
        res = self.run(C.list_units()) if not self.opts.journal_directory else None
        if res is not None and res.rc == 0:
            for line in res.stdout.decode(errors="replace").splitlines():
                cols = line.split()
                if cols and cols[0].endswith(".service") and self.opts.unit_pattern.search(cols[0]):
                    active = len(cols) > 2 and cols[2] == "active"
                    names.append(cols[0] if active else "~" + cols[0])
            running = [n for n in names if not n.startswith("~")]
            names = running or [n[1:] for n in names]
        if not names:  # systemctl cannot answer (container, --journal-directory): ask the journal itself
            d = self.opts.journal_directory
            res = self.run(C.journal_units(d))
            if res.rc != 0:
                raise NoEngineFound(f"{self.target}: cannot read the journal{' in ' + d if d else ''}: "
                                    f"{_first_line(res.stderr) or f'rc {res.rc}'}")
            names = [u for u in res.stdout.decode(errors="replace").split() if self.opts.unit_pattern.search(u)]
        names = sorted(set(names))
        if not names:
            raise NoEngineFound(f"{self.target}: no systemd unit that looks like an inference engine; "
                                "name it with --unit, or use --source docker:NAME / file:PATH")
        if len(names) > 1:
            raise NoEngineFound(f"{self.target}: several engine units ({', '.join(names)}); pick one with --unit")
        return names[0]

    def _lines(self, res: CommandResult) -> list[tuple[int, str]]:
        self.raw["log"] = res.stdout
        if res.truncated:
            self.partial.append(f"log output cut at {self.opts.max_output:,} bytes")
        out = []
        for raw in res.stdout.split(b"\n"):
            num, sep, body = raw.partition(b":")
            if not sep or not num.isdigit():
                continue
            out.append((int(num), body.decode("utf-8", "replace")))
        return out

    # --- processes of the engine --------------------------------------------------------------------------
    def server_pids(self) -> tuple[int, ...]:
        if not self.unit or self.opts.journal_directory:
            return ()
        res = self.run(C.control_group(self.unit))
        cg = res.stdout.decode(errors="replace").strip() if res.rc == 0 else ""
        if not cg:
            return ()
        pids = self.run(C.cgroup_pids(cg))
        return tuple(int(x) for x in pids.stdout.split() if x.isdigit())

    # --- the host's processes ------------------------------------------------------------------------------
    # Where no cgroup names the engine's processes (a container, a plain process, --journal-directory, a file or
    # docker source), the start names its own: the journal's _PID of its latest line, a syslog prefix's
    # python3[48190], a container's init. With ps's table that process and its children are the engine's; every
    # other process nvidia-smi lists is someone else's, named by its title.
    def start_pids(self, lines: list[tuple[int, str]]) -> tuple[int, ...]:
        """The engine's start as its log names it (not yet checked against the host's processes)."""
        src = self.opts.source or ""
        if src.startswith("docker:"):
            res = self.run(C.docker_pid(src[7:]))
            said = res.stdout.decode(errors="replace").strip() if res.rc == 0 else ""
            return (int(said),) if said.isdigit() and 0 < int(said) < 1 << 31 else ()
        if src.startswith("file:") or not self.unit:
            pid = log_pid(lines)
            return (pid,) if pid else ()
        res = self.run(C.journal_pid(self.unit, self.invocation, self.opts.journal_directory))
        m = re.search(rb"^_PID=([1-9][0-9]{0,9})$", res.stdout, re.M) if res.rc == 0 else None
        return (int(m.group(1)),) if m and int(m.group(1)) < 1 << 31 else ()

    def host_processes(self, apps: list[ComputeApp], start: tuple[int, ...], cgroup: tuple[int, ...]
                       ) -> tuple[tuple[HostProcess, ...], tuple[tuple[str, float], ...], tuple[int, ...]]:
        """ps's table, kept to the processes that matter (nvidia-smi's, those titled as an engine's, the start's
        and its children), with each GPU process's memory; /proc/meminfo; the engine's PIDs (the cgroup's, or the
        start's process and its children where it runs on the host and is an engine's)."""
        on_gpu = tuple(dict.fromkeys(a.pid for a in apps if a.pid > 0))[:C.MAX_STATUS_PIDS]
        res = self.run(C.process_list(on_gpu, self.opts.unit_fragments))
        table = parse_ps(res.stdout.decode("utf-8", "replace")) if res.rc == 0 else {}
        if not table:
            return (), (), cgroup
        named = re.compile("|".join(re.escape(n) for n in self.opts.engine_names) or r"(?!)", re.I)
        engine = set(cgroup)
        started = [p for p in start if p in table]
        family = descendants(table, started)
        if any(named.search(table[p].title) for p in family):  # a reused PID, or a log from elsewhere, is not
            engine |= family
        keep = set(on_gpu) | engine | {p for p, h in table.items() if named.search(h.title)}
        mem = self.run(C.process_memory(on_gpu))
        meminfo, status = parse_proc_memory(mem.stdout.decode("utf-8", "replace"))
        procs = tuple(replace(table[p], rss_mib=status.get(p, {}).get("VmRSS"),
                              swap_mib=status.get(p, {}).get("VmSwap")) for p in sorted(keep) if p in table)
        procs = procs[:MAX_PROCESSES]
        return procs, tuple(sorted(meminfo.items())), tuple(sorted(engine))

    # --- GPUs ---------------------------------------------------------------------------------------------
    def _smi_timeout(self) -> int:
        """The seconds one nvidia-smi may take: SMI_TIMEOUT_S, and at most a third of what is left of the host's
        deadline (a runner that has one), never under SMI_MIN_S (nvidia-smi answers in about a second on a healthy
        node), so that a hung driver costs the readings, never the audit of the log already read (the health check
        then says a node problem, not unknown). The process list is not asked for when the GPU query hung."""
        import time

        t = float(C.SMI_TIMEOUT_S)
        deadline = getattr(self.runner, "deadline", None)
        if isinstance(deadline, (int, float)):
            t = min(t, (deadline - time.monotonic()) / 3)
        return max(C.SMI_MIN_S, int(t))

    def gpus(self) -> tuple[list[GpuReading], list[ComputeApp]]:
        smi_t = self._smi_timeout()
        res = self.run(C.query_gpus(), timeout=smi_t)
        self.raw["gpus"] = res.stdout
        if res.rc is None or res.rc == 124:  # the runner's timeout, or the host's own `timeout` wrapper
            self.partial.append(f"{SMI_FAILED}: no answer within {smi_t} s (a hung driver or GPU); no GPU readings")
            return [], []
        if res.rc != 0:
            why = _first_line(res.stderr) or _first_line(res.stdout) or f"rc {res.rc}"
            if res.rc == 127 or "not found" in why:
                self.partial.append(f"{SMI_MISSING} on the host: no GPU readings")
            else:
                self.partial.append(f"{SMI_FAILED}: {why}")
            return [], []
        try:
            gpus = parse_gpus(res.stdout.decode(errors="replace"))
        except SmiParseError as exc:
            self.partial.append(str(exc))
            return [], []
        apps_res = self.run(C.query_apps(), timeout=smi_t)
        self.raw["apps"] = apps_res.stdout
        try:
            apps = parse_apps(apps_res.stdout.decode(errors="replace")) if apps_res.rc == 0 else []
        except SmiParseError as exc:
            self.partial.append(f"nvidia-smi process list: {exc}")
            apps = []
        if apps_res.rc != 0:
            self.partial.append(f"nvidia-smi process list failed: {_first_line(apps_res.stderr) or apps_res.rc}")
        return gpus, apps

    # --- model config -------------------------------------------------------------------------------------
    def config(self, model_path: str | None) -> tuple[str | None, str | None]:
        # the unit's processes are read in the same round trip as the config
        if self.unit and not self.opts.journal_directory:
            cg = self.run(C.control_group(self.unit))
            group = cg.stdout.decode(errors="replace").strip() if cg.rc == 0 else ""
            if model_path and model_path.startswith("/") and group:
                self.prefetch([C.read_config(model_path.rstrip("/") + "/config.json"), C.cgroup_pids(group)])
        if not model_path:
            self.partial.append(f"{NO_CONFIG}: the log names no model path; bytes per token from the KV line")
            return None, None
        candidates = []
        if model_path.startswith("/"):
            candidates.append(model_path.rstrip("/") + "/config.json")
        elif re.fullmatch(r"[\w.-]+/[\w.-]+", model_path):
            res = self.run(C.hf_snapshots(model_path))
            candidates += [d.rstrip("/") + "/config.json" for d in res.stdout.decode(errors="replace").split()]
        for path in candidates:
            res = self.run(C.read_config(path))
            if res.rc == 0 and res.stdout.strip():
                if not is_model_config(res.stdout):
                    # a forged or stray path (a request's text naming ~/.docker): its config.json is not a
                    # model's and reaches neither the report nor a capture
                    self.partial.append(f"{NO_CONFIG}: {printable(path)!r} is not a model's config.json (a JSON "
                                        "object with model_type, architectures or the model's dimensions): not "
                                        "used; bytes per token from the KV line")
                    return None, None
                self.raw["config"] = res.stdout
                return res.stdout.decode("utf-8", "replace"), path
        self.partial.append(f"{NO_CONFIG} found for model_path {model_path!r}; bytes per token from the KV line")
        return None, None

    def hostname(self) -> None:
        res = self.run(C.hostname())
        if res.rc == 0:
            self.host = printable(res.stdout.decode(errors="replace").strip())[:255] or None

    def result(self, lines, gpus, apps, config, config_source, pids, gpu_source) -> Collected:
        procs: tuple[HostProcess, ...] = ()
        meminfo: tuple[tuple[str, float], ...] = ()
        start: tuple[int, ...] = ()
        try:
            start = self.start_pids(list(lines))
            procs, meminfo, pids = self.host_processes(list(apps), start, tuple(pids))
        except CollectError:  # the host went away or its time ran out: the readings already taken stand
            pass
        return Collected(
            target=self.target, host=self.host, source=self.source_desc, log_lines=tuple(lines),
            gpus=tuple(gpus), apps=tuple(apps), config_json=config, config_source=config_source,
            server_pids=tuple(pids), commands=tuple(self.records), partial=tuple(self.partial),
            collected_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            unit=self.unit, invocation_id=self.invocation, gpu_source=gpu_source,
            processes=procs, meminfo_mib=meminfo, start_pids=start,
        )


#: the most processes a Collected keeps (a host with thousands of engine-titled processes is said as it is cut)
MAX_PROCESSES = 512
#: the words of a command line kept as its title: an engine's title (sglang::scheduler_TP0), or the program and
#: what it runs (python3 -m sglang.launch_server, vllm serve MODEL); later arguments may hold secrets (--api-key)
TITLE_WORDS = 3
_PS_LINE = re.compile(r"\s*([1-9][0-9]{0,9})\s+([0-9]{1,10})\s+(\S{1,8})\s+(.*)")
#: a syslog-style line (journalctl -o short or short-iso, rsyslog): ``... host python3[48190]: message``
_SYSLOG_PID = re.compile(r"^(?:\S+ ){2,4}[^\s\[\]]{1,64}\[([1-9][0-9]{0,9})\]: ")


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split() if x.isdigit() and x[0] != "0")


def log_pid(lines: list[tuple[int, str]]) -> int | None:
    """The process that wrote the latest syslog-prefixed line (the start's main process), or None."""
    for _, text in reversed(lines):
        m = _SYSLOG_PID.match(text)
        if m:
            return int(m.group(1))
    return None


def parse_ps(text: str) -> dict[int, HostProcess]:
    """``ps -e -o pid=,ppid=,stat=,args=`` as pid -> HostProcess (the title cut to its first words, printable)."""
    out: dict[int, HostProcess] = {}
    for line in text.splitlines():
        m = _PS_LINE.fullmatch(line)
        if m:
            title = printable(" ".join(m.group(4).split()[:TITLE_WORDS]))[:120]
            out[int(m.group(1))] = HostProcess(int(m.group(1)), int(m.group(2)), m.group(3), title)
    return out


def descendants(table: dict[int, HostProcess], roots: list[int]) -> set[int]:
    """The roots and every process below them in ps's table."""
    children: dict[int, list[int]] = {}
    for p in table.values():
        children.setdefault(p.ppid, []).append(p.pid)
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += children.get(pid, [])
    return seen


_MEM_LINE = re.compile(r"(/proc/meminfo|/proc/([1-9][0-9]{0,9})/status):(\w+):\s+([0-9]{1,15}) kB")


def parse_proc_memory(text: str) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """``grep -H`` over /proc/meminfo and /proc/PID/status: meminfo's keys, and each PID's, in MiB."""
    meminfo: dict[str, float] = {}
    status: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        m = _MEM_LINE.fullmatch(line.strip())
        if not m:
            continue
        mib = round(int(m.group(4)) / 1024, 1)
        if m.group(2):
            status.setdefault(int(m.group(2)), {})[m.group(3)] = mib
        else:
            meminfo[m.group(3)] = mib
    return meminfo, status


_GO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2})(\.\d{1,9})? ([+-]\d{2})(\d{2})(?: [A-Za-z0-9+-]{1,8})?"
                      r"(?: m=[+-][0-9.]+)?")


def docker_since(text: str) -> str | None:
    """``docker inspect``'s StartedAt as ``docker logs --since`` takes it (RFC 3339). A Go ``time.String()`` form
    (``2026-02-25 10:12:01.5 +0000 UTC``: a wrapper or an older client) is rewritten; anything else is no start
    time (all the container's lines are read), never a command the gate refuses."""
    first = text.strip().split("\n", 1)[0].strip()
    m = _GO_TIME.fullmatch(first)
    if m:
        first = f"{m.group(1)}T{m.group(2)}{m.group(3) or ''}{m.group(4)}:{m.group(5)}"
    return first if C.is_docker_time(first) else None


#: keys one of which every model config has (Hugging Face's config.json, a multimodal one's nested language model,
#: a TensorRT-LLM checkpoint's or engine's config.json); a registry's auth file, a package.json, a tool's settings
#: have none of them
MODEL_CONFIG_KEYS = frozenset({
    "model_type", "architectures", "architecture", "num_hidden_layers", "hidden_size", "num_attention_heads",
    "n_layer", "num_layers", "text_config", "llm_config", "language_config", "thinker_config", "pretrained_config"})


def is_model_config(data: bytes) -> bool:
    """Whether ``data`` (a config.json read from a host, at most CONFIG_MAX_BYTES) parses as a model config: a
    JSON object with a model config's keys. Only such a file reaches a report or a capture."""
    import json

    if len(data) > C.CONFIG_MAX_BYTES:
        return False
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(doc, dict) and not MODEL_CONFIG_KEYS.isdisjoint(doc)


@record
class ScriptPart:
    kind: str
    args: tuple[str, ...]
    rc: int | None
    stdout: bytes
    stderr: bytes
    seconds: float


_TIMED_OUT = b"[kvaudit: timed out]"


#: what follows a part's begin marker (its tab-separated header) and its end marker (its exit status)
_HEAD_FIELDS = re.compile(rb"((?:\t[^\t\n]*)*)\n")
_END_STATUS = re.compile(rb"(\d{1,3})\n")


def _framed(data: bytes, marker: bytes, rest: re.Pattern[bytes], pos: int,
            endpos: int) -> list[tuple[int, int, bytes]]:
    """The non-overlapping ``marker`` + ``rest`` matches in ``data[pos:endpos]``, left to right, as ``finditer``
    of the two as one pattern finds them (the marker holds the host's nonce: one compiled pattern for every host,
    not two compiled per host): (the marker's start, the match's end, ``rest``'s group 1) each."""
    found = []
    while (i := data.find(marker, pos, endpos)) >= 0:
        m = rest.match(data, i + len(marker), endpos)
        if m is None:
            pos = i + 1
            continue
        found.append((i, m.end(), m.group(1)))
        pos = m.end()
    return found


def script_parts(res: CommandResult, nonce: bytes) -> list[ScriptPart]:
    """The host script's parts, in order: each one's header (kind and arguments), status, stdout and stderr.
    A part whose stdout or stderr framing is not whole is left out (the session runs that command on its own),
    except the one a timeout stopped: it is kept as that command's timed-out result, as it would have been."""
    begin, end = b"\n@@" + nonce + b" begin", b"\n@@" + nonce + b" end "
    err_begin, err_end = b"\n@@" + nonce + b" begin\n", b"\n@@" + nonce + b" end\n"
    errs: list[bytes] = []
    at = 0
    while (i := res.stderr.find(err_begin, at)) >= 0:
        j = res.stderr.find(err_end, i + len(err_begin))
        if j < 0:
            break
        errs.append(res.stderr[i + len(err_begin):j])
        at = j + len(err_end)
    heads = _framed(res.stdout, begin, _HEAD_FIELDS, 0, len(res.stdout))
    parts: list[ScriptPart] = []
    each = res.seconds / max(1, len(heads))
    timed_out = res.rc is None and _TIMED_OUT in res.stderr
    for n, head in enumerate(heads):
        _, head_end, fields = head
        words = fields.decode("utf-8", "surrogateescape").split("\t")[1:]
        kind, args = (words[0], tuple(words[1:])) if words else ("", ())
        stop = heads[n + 1][0] if n + 1 < len(heads) else len(res.stdout)
        closing = next(iter(_framed(res.stdout, end, _END_STATUS, head_end, stop + 1)), None)
        if closing is None or n >= len(errs):
            if timed_out and n == len(heads) - 1:  # where the time ran out: as that command's own timeout
                parts.append(ScriptPart(kind, args, None, res.stdout[head_end:], _TIMED_OUT, each))
            break  # later parts are not framed whole either
        parts.append(ScriptPart(kind, args, int(closing[2]), res.stdout[head_end:closing[0]],
                                errs[n], each))
    return parts


#: journalctl's words when the login user may not read the system journal (systemd 239-255)
_DENIED = re.compile(r"insufficient permissions|not seeing messages from other users|Permission denied", re.I)
_GROUPS = re.compile(r"Users in groups? ([^.]*?) can see all messages")


def _journal_denied(stderr: bytes) -> str | None:
    """What to tell when journalctl refused the system journal: the groups that may read it, as it names them."""
    text = stderr.decode("utf-8", "replace")
    if not _DENIED.search(text):
        return None
    m = _GROUPS.search(text)
    groups = m.group(1).replace("'", "") if m else "systemd-journal (or adm)"
    return (f"the login user may not read the system journal (journalctl: {_first_line(stderr)}); add it to "
            f"{groups}, or log in as root")


def _first_line(b: bytes) -> str:
    for line in b.decode("utf-8", "replace").splitlines():
        if line.strip():
            return printable(line.strip()[:300])
    return ""
