"""Who holds the GPUs on a host without systemd (issue 37, items 5 and 6): a real sshd, real processes whose
titles are the engine's (``exec -a`` sets argv[0] as setproctitle does), the engine's start named by its journal's
_PID or a syslog prefix, an orphaned scheduler of an earlier start and a stopped tenant, both named with their
PIDs and GiB; nvidia-smi is replayed (no GPU here) with the real PIDs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kvaudit.collect.interface import Collected, ComputeApp, GpuReading, HostProcess
from kvaudit.collect.session import log_pid, parse_proc_memory, parse_ps
from kvaudit.engines import process_names
from kvaudit.reconcile.live import reconcile_gpus
from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import CAPTURE, needs_journal, needs_sshd
from tests.conftest import KIMI_CONFIG, KIMI_LOG, cli_process

GIB_MIB = 1024


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _argv0(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


def _wait(cond, what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """An engine (a launcher titled ``python3 -m sglang.launch_server`` and its 8 ``sglang::scheduler_TPn``), a
    scheduler left by an earlier start (its launcher gone: reparented), another tenant, stopped."""
    if not os.path.exists(hostsim.SSHD) or hostsim.JOURNAL_REMOTE is None:
        pytest.skip("openssh-server / systemd-journal-remote not installed (make test installs them as root)")
    root = tmp_path_factory.mktemp("node")
    workers = "".join(f"exec -a sglang::scheduler_TP{i} sleep 900 & " for i in range(8))
    engine = subprocess.Popen(["bash", "-c", workers + "exec -a 'python3 -m sglang.launch_server' sleep 900"],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    orphan_out = subprocess.run(["bash", "-c", "(exec -a sglang::scheduler_TP3 sleep 900 >/dev/null 2>&1 & echo $!)"],
                                capture_output=True, text=True, start_new_session=True, timeout=20)
    orphan = int(orphan_out.stdout.strip())
    tenant = subprocess.Popen(["bash", "-c", "exec -a 'python3 train.py' sleep 900"], start_new_session=True)
    procs = [engine.pid, orphan, tenant.pid]
    try:
        _wait(lambda: len(_children(engine.pid)) == 8 and all(
            _argv0(p).startswith(b"sglang::scheduler_TP") for p in _children(engine.pid)), "the engine's 8 schedulers")
        _wait(lambda: _argv0(orphan) == b"sglang::scheduler_TP3", "the orphan")
        _wait(lambda: b"sglang.launch_server" in Path(f"/proc/{engine.pid}/cmdline").read_bytes(), "the launcher")
        schedulers = sorted(_children(engine.pid))
        procs += schedulers
        by_rank = {int(_argv0(p).rsplit(b"TP", 1)[1]): p for p in schedulers}
        # stopped only once bash has exec'd it: a SIGSTOP before the exec leaves a stopped bash with another title
        _wait(lambda: _argv0(tenant.pid) == b"python3 train.py", "the tenant's title")
        os.kill(tenant.pid, signal.SIGSTOP)
        _wait(lambda: Path(f"/proc/{tenant.pid}/stat").read_text().split(") ")[1][:1] == "T", "the stopped tenant")
        uuids = [line.split(", ")[1] for line in (CAPTURE / "nvidia-smi-gpus.csv").read_text().splitlines()]
        # nvidia-smi names a process as its command line's first word (the title setproctitle wrote)
        apps = [f"{by_rank[i]}, {uuids[i]}, sglang::scheduler_TP{i}, {91271 - (6144 if i in (3, 5) else 0)}"
                for i in range(8)]
        apps += [f"{orphan}, {uuids[3]}, sglang::scheduler_TP3, 6144", f"{tenant.pid}, {uuids[5]}, python3, 6144"]
        host = hostsim.make_host(root / "host", KIMI_LOG.read_bytes(), (CAPTURE / "nvidia-smi-gpus.csv").read_text(),
                                 "\n".join(apps) + "\n", KIMI_CONFIG.read_text())
        kimi = KIMI_LOG.read_bytes().replace(b"/models/moonshotai/Kimi-K2.5", str(host.model_dir).encode())
        # the start's journal, its lines written by the launcher's PID (a unit without a cgroup: read by directory)
        hostsim.write_journal(root / "journal-live", hostsim.export_entries(
            kimi.rstrip(b"\n").split(b"\n"), "sglang.service", "f" * 32, engine.pid, 1_771_900_000_000_000))
        # the same start as a syslog file (rsyslog / journalctl -o short): the PID in each line's prefix
        (root / "syslog.log").write_bytes(b"".join(
            b"Feb 25 10:12:01 gpu-node-07 python3[%d]: %s\n" % (engine.pid, line)
            for line in kimi.rstrip(b"\n").split(b"\n")))
        key = root / "client_key"
        sshd = hostsim.start_sshd(root / "sshd", hostsim.keygen(key), [host.bin])
        cfg = root / "ssh_config"
        (root / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
        cfg.write_text(f"Host gpu-node\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
                       f"    User {os.environ.get('USER') or 'root'}\n    IdentityFile {key}\n    IdentitiesOnly yes\n"
                       f"    UserKnownHostsFile {root / 'known_hosts'}\n")
        yield {"cfg": cfg, "root": root, "engine": engine.pid, "schedulers": by_rank, "orphan": orphan,
               "tenant": tenant.pid}
        sshd.stop()
    finally:
        for p in procs:  # only the processes this fixture started, by their ids
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (engine, tenant):
            p.wait(10)


def _check(node, *source: str):
    r = cli_process("check", "gpu-node", "--ssh-config", node["cfg"], *source, "--format", "json", timeout=90)
    assert r.code in (ExitStatus.OK, ExitStatus.WARNINGS), r.stderr
    return r.json()


def _finding(doc, code: str) -> dict:
    found = [f for f in doc["findings"] if f["code"] == code]
    assert len(found) == 1, [f["code"] for f in doc["findings"]]
    return found[0]


@needs_sshd
@needs_journal
@pytest.mark.parametrize("source", ["journal", "syslog"])
def test_engine_orphan_and_tenant_named_with_pids_and_gib(node, source):
    args = (("--journal-directory", str(node["root"] / "journal-live")) if source == "journal"
            else ("--source", f"file:{node['root'] / 'syslog.log'}"))
    doc = _check(node, *args)
    engine = {node["engine"], *node["schedulers"].values()}
    assert engine <= set(doc["host"]["server_pids"]) and node["orphan"] not in doc["host"]["server_pids"]
    # every GPU: its rank by the scheduler's title, the engine's memory and its process by PID
    for g in doc["gpus"]:
        i = g["index"]
        assert g["rank"] == f"TP{i}" and g["mapped_by"] == "process name"
        assert g["engine_gib"] == round((91271 - (6144 if i in (3, 5) else 0)) / GIB_MIB, 3)
        assert [p["pid"] for p in g["engine_processes"]] == [node["schedulers"][i]]
        assert g["engine_processes"][0]["name"].startswith(f"sglang::scheduler_TP{i}")
    orphan = _finding(doc, "ORPHANED_ENGINE_PROCESS")
    assert orphan["severity"] == "warning" and orphan["fields"]["pids"] == [node["orphan"]]
    assert orphan["fields"]["processes"][0]["gib"] == 6.0 and orphan["fields"]["processes"][0]["gpus"] == [3]
    assert f"kill {node['orphan']}" in orphan["message"] and "6.00 GiB on GPU 3" in orphan["message"]
    assert doc["gpus"][3]["foreign_processes"] == []  # an orphan is named as one, not as a tenant
    foreign = _finding(doc, "FOREIGN_PROCESS")
    assert f"pid {node['tenant']} (python3 train.py" in foreign["message"] and foreign["fields"]["gpu"] == 5
    idle = _finding(doc, "IDLE_TENANT_MEMORY")
    assert idle["fields"]["pid"] == node["tenant"] and idle["fields"]["why"] == "stopped"
    assert idle["fields"]["gib"] == 6.0 and f"kill -CONT {node['tenant']}" in idle["message"]


@needs_sshd
@needs_journal
def test_a_capture_replays_who_held_the_gpus(node, tmp_path):
    """The capture a ticket carries names the orphan and the idle tenant as the live check did: the processes,
    the start's PIDs and /proc/meminfo travel in capture.json."""
    out = tmp_path / "cap"
    r = cli_process("capture", "gpu-node", "--ssh-config", node["cfg"], "--journal-directory",
                    str(node["root"] / "journal-live"), "-o", out, timeout=90)
    assert r.code == 0, r.stderr
    live = _check(node, "--journal-directory", str(node["root"] / "journal-live"))
    replay = cli_process("check", out, "--format", "json")
    assert replay.code in (ExitStatus.OK, ExitStatus.WARNINGS), replay.stderr
    doc = replay.json()
    for code in ("ORPHANED_ENGINE_PROCESS", "IDLE_TENANT_MEMORY", "FOREIGN_PROCESS"):
        assert _finding(doc, code)["fields"] == _finding(live, code)["fields"]
    assert [g["engine_processes"] for g in doc["gpus"]] == [g["engine_processes"] for g in live["gpus"]]


@needs_sshd
@needs_journal
def test_text_report_names_them(node):
    r = cli_process("check", "gpu-node", "--ssh-config", node["cfg"], "--journal-directory",
                    str(node["root"] / "journal-live"), timeout=90)
    assert f"pid {node['orphan']} (sglang::scheduler_TP3" in r.stdout
    assert f"pid {node['tenant']} (python3 train.py" in r.stdout


# --- the parts, on the shapes real hosts give ---------------------------------------------------------------

def test_ps_rows_keep_the_title_not_the_secrets():
    table = parse_ps("  48190     1 Sl   python3 -m sglang.launch_server --api-key s3cret\n"
                     "  48211 48190 Rl   sglang::scheduler_TP0\n 77001  4000 T    python3 train.py --lr 1e-4\n"
                     "garbage line\n")
    assert table[48190].title == "python3 -m sglang.launch_server" and table[48211].ppid == 48190
    assert table[77001].state == "T" and len(table) == 3


def test_syslog_prefix_names_the_start():
    lines = [(1, "2026-02-25T10:12:01+0000 gpu-node-07 python3[4000]: old start"),
             (9, "Feb 25 10:12:01 gpu-node-07 python3[48190]: [2026-02-25 TP0] KV Cache is allocated."),
             (10, "a line without a prefix python3[666]: text")]
    assert log_pid(lines) == 48190
    assert log_pid([(1, "[2026-02-25 TP0] KV Cache is allocated.")]) is None


def test_proc_memory_lines():
    meminfo, status = parse_proc_memory("/proc/meminfo:MemTotal:       127535104 kB\n"
                                        "/proc/meminfo:Cached:         52428800 kB\n"
                                        "/proc/77001/status:VmSwap:\t 3145728 kB\n/proc/77001/status:VmRSS:  1024 kB\n")
    assert meminfo == {"MemTotal": 124546.0, "Cached": 51200.0}
    assert status == {77001: {"VmSwap": 3072.0, "VmRSS": 1.0}}


def _collected(gpus, apps, processes, meminfo=(), pids=()) -> Collected:
    return Collected("h", "h", "file:x", (), tuple(gpus), tuple(apps), None, None, tuple(pids), (), (), "now",
                     processes=tuple(processes), meminfo_mib=tuple(meminfo))


GPU = GpuReading(0, "GPU-0", "NVIDIA H200", "0:0", 143771.0, 0.0, 80000.0, 63771.0)


def test_swapped_out_tenant_and_a_sleeping_engine():
    apps = [ComputeApp(10, "GPU-0", "python3", 70000.0), ComputeApp(20, "GPU-0", "python3", 4096.0),
            ComputeApp(31, "GPU-0", "VLLM::EngineCore", 512.0)]
    procs = [HostProcess(1, 0, "S", "/sbin/init"), HostProcess(10, 1, "Sl", "python3 -m sglang.launch_server"),
             HostProcess(20, 1, "S", "python3 batch.py", rss_mib=100.0, swap_mib=3072.0),
             HostProcess(30, 1, "Sl", "vllm serve Qwen/Qwen3-8B"),
             HostProcess(31, 30, "Sl", "VLLM::EngineCore", rss_mib=20480.0)]
    ledgers, findings = reconcile_gpus(None, _collected([GPU], apps, procs, pids=(10,)), 0,
                                       engine_names=process_names())
    assert [p.pid for p in ledgers[0].engine_processes] == [10] and ledgers[0].server_gib == 68.359
    assert {f.pid for f in ledgers[0].foreign} == {20, 31} and ledgers[0].orphaned == ()
    assert not [f for f in findings if f.code == "ORPHANED_ENGINE_PROCESS"]  # a live vLLM start is no orphan


def test_unified_page_cache_is_named_with_its_fix():
    spark = GpuReading(0, "GPU-0", "NVIDIA GB10", "0:0", None, None, None, None)
    c = _collected([spark], [], [], meminfo=(("MemTotal", 124546.0), ("Cached", 40960.0), ("Buffers", 1024.0)))
    _, findings = reconcile_gpus(None, c, 0, engine_names=process_names())
    f = next(f for f in findings if f.code == "UNIFIED_PAGE_CACHE")
    assert f.severity.value == "warning" and f.fields["page_cache_gib"] == 41.0
    assert "drop_caches" in f.message
    # Cached holds shared memory (NCCL's /dev/shm) that drop_caches cannot free: left out where the host said it
    shm = _collected([spark], [], [], meminfo=(("MemTotal", 124546.0), ("Cached", 40960.0), ("Buffers", 1024.0),
                                              ("Shmem", 36864.0)))
    f = next(f for f in reconcile_gpus(None, shm, 0, engine_names=process_names())[1] if f.code == "UNIFIED_PAGE_CACHE")
    assert f.severity.value == "info" and f.fields["page_cache_gib"] == 5.0 and f.fields["shared_memory_gib"] == 36.0
    assert "36.00 GiB of shared memory" in f.message
    h200 = _collected([GPU], [], [], meminfo=(("MemTotal", 124546.0), ("Cached", 40960.0)))
    assert not [f for f in reconcile_gpus(None, h200, 0, engine_names=process_names())[1]
                if f.code == "UNIFIED_PAGE_CACHE"]  # a card of its own: the page cache is not its memory


def test_a_replayed_pid_that_is_another_program_is_not_mixed_up():
    apps = [ComputeApp(10, "GPU-0", "sglang::scheduler_TP0", 70000.0)]
    procs = [HostProcess(10, 1, "T", "bash")]  # this machine's PID 10 is something else
    ledgers, findings = reconcile_gpus(None, _collected([GPU], apps, procs), 0, engine_names=process_names())
    assert ledgers[0].server_gib == 68.359 and not ledgers[0].foreign
    assert not [f for f in findings if f.code == "IDLE_TENANT_MEMORY"]


@needs_sshd
@needs_journal
def test_health_check_says_the_orphan_first_line(node):
    """Nagios/NPD read the first line: the orphan's GPU memory is a node problem (critical), with its PID."""
    r = cli_process("check", "gpu-node", "--ssh-config", node["cfg"], "--journal-directory",
                    str(node["root"] / "journal-live"), "--health-check", "--timeout", "60", timeout=90)
    first = r.stdout.splitlines()[0]
    status = first.split(" | ")[0]  # Nagios perfdata after the bar
    assert r.code == 2 and status.startswith("KVAUDIT CRITICAL") and len(status.encode()) <= 80, r.stdout
    assert "node_problems=3;" in first
    assert f"ORPHANED_ENGINE_PROCESS (node): 1 engine process outside this start (pid {node['engine']})" in r.stdout
    assert f"`kill {node['orphan']}`" in r.stdout and f"`kill -CONT {node['tenant']}`" in r.stdout


def _kimi_with(extra_apps, processes, server_pids=()):
    """The bundled Kimi capture (8 ranks mapped by their schedulers' titles), with more processes on its GPUs."""
    from dataclasses import replace

    from kvaudit.check import CheckOptions, _parse, audit_collected
    from kvaudit.collect import capture
    from kvaudit.reconcile.interface import AuditOptions

    c = capture.read(str(CAPTURE))
    c = replace(c, apps=c.apps + tuple(extra_apps), processes=tuple(processes), server_pids=tuple(server_pids))
    return audit_collected(c, _parse(c), CheckOptions(AuditOptions()))


def test_a_swapped_out_tenant_and_a_sleeping_engine_on_the_engines_gpus():
    uuid = "GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c00000"
    apps = [ComputeApp(20, uuid + "2", "python3", 4096.0), ComputeApp(31, uuid + "4", "VLLM::EngineCore", 512.0)]
    procs = [HostProcess(48190, 1, "Sl", "python3 -m sglang.launch_server"),
             *(HostProcess(48211 + i, 48190, "Sl", f"sglang::scheduler_TP{i}") for i in range(8)),
             HostProcess(20, 1, "S", "python3 batch.py", rss_mib=100.0, swap_mib=3072.0),
             HostProcess(30, 1, "Sl", "vllm serve Qwen/Qwen3-8B"),
             HostProcess(31, 30, "Sl", "VLLM::EngineCore", rss_mib=20480.0)]
    h = _kimi_with(apps, procs, server_pids=(48190, *range(48211, 48219)))
    idle = {f.fields["pid"]: f for f in h.findings if f.code == "IDLE_TENANT_MEMORY"}
    assert set(idle) == {20, 31}
    assert idle[20].fields["why"] == "swapped" and idle[20].fields["gpu"] == 2 and "3.00 GiB" in idle[20].message
    assert idle[31].fields["why"] == "asleep" and "takes its GPU memory back when woken" in idle[31].message
    assert not [f for f in h.findings if f.code == "ORPHANED_ENGINE_PROCESS"]  # a live vLLM start is no orphan
    assert "another engine start's" in next(f.message for f in h.findings
                                           if f.code == "FOREIGN_PROCESS" and f.fields["gpu"] == 4)
    # without the host's processes: nvidia-smi's names alone, no state, nothing said about idleness
    bare = _kimi_with(apps, ())
    assert not [f for f in bare.findings if f.code == "IDLE_TENANT_MEMORY"]


@pytest.mark.parametrize("parent, orphaned", [
    (HostProcess(40, 1, "Sl", "python3 serve.py --port 9000"), False),  # the engine's Python API in a live program
    (HostProcess(40, 1, "Ss", "/usr/bin/tini -- python3"), True),  # a container's subreaper (3 words, as ps gives)
    (None, True),  # adopted by init: its launcher died
])
def test_workers_under_a_live_program_are_a_server_not_an_orphan(parent, orphaned):
    """Workers titled as SGLang's without a launcher above them are an orphan only where their launcher died (init
    or a subreaper adopted them); under a live `python3 serve.py` (sglang.Engine, vLLM's LLM, Ray) they are
    someone's live server, and kvaudit never tells on-call to kill it."""
    uuid = "GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c00000"
    apps = [ComputeApp(41, uuid + "3", "sglang::scheduler_TP0", 6144.0)]
    procs = [HostProcess(48190, 1, "Sl", "python3 -m sglang.launch_server"),
             *(HostProcess(48211 + i, 48190, "Sl", f"sglang::scheduler_TP{i}") for i in range(8)),
             HostProcess(41, 40 if parent else 1, "Sl", "sglang::scheduler_TP0"), *([parent] if parent else [])]
    h = _kimi_with(apps, procs, server_pids=(48190, *range(48211, 48219)))
    found = [f for f in h.findings if f.code == "ORPHANED_ENGINE_PROCESS"]
    assert bool(found) == orphaned, [f.message for f in h.findings]
    if not orphaned:
        shared = next(f for f in h.findings if f.code == "FOREIGN_PROCESS" and f.fields["gpu"] == 3)
        assert "pid 41" in shared.message and "kill" not in shared.message


def test_the_gate_takes_the_process_commands_as_built_and_nothing_else():
    from kvaudit.collect import commands as C

    built = [C.process_list((48190, 77001), ("sglang", "vllm")), C.process_list((), ()),
             C.process_memory((48190, 77001)), C.process_memory(()), C.journal_pid("sglang.service", "f" * 32, "/j"),
             C.journal_pid("sglang.service", None, None), C.docker_pid("sglang")]
    assert all(C.is_allowed(c) for c in built)
    import shlex

    def ps(pids: str, fragments: str) -> str:
        return shlex.join(["sh", "-c", C.PS_SCRIPT, "sh", pids, fragments])

    assert C.is_allowed(ps("1 22", "sglang vllm"))
    refused = [ps("1; reboot", "sglang"), ps("1", "$(reboot)"), ps("1", "Sglang"), ps("01", "sglang"),
               shlex.join(["sh", "-c", C.PS_SCRIPT + "; reboot", "sh", "1", "sglang"]),
               C.process_memory((1,)).replace("/proc/1/status", "/etc/shadow"),
               C.process_memory((1,)).replace("^VmSwap:", "."),
               C.process_memory(tuple(range(1, 66))) + " /proc/66/status",
               C.docker_pid("x").replace("{{.State.Pid}}", "{{json .Config.Env}}"),
               C.journal_pid("u", None, None).replace("--output-fields=_PID", "--output-fields=MESSAGE")]
    assert not any(C.is_allowed(c) for c in refused)


@needs_sshd
@needs_journal
def test_nvsentinel_events_name_the_orphans_gpu(node):
    """The NVSentinel sink, parsed by its own proto (tests/nvsentinel_stub.py): the orphan and the stopped tenant
    are fatal GPU events on the GPUs they hold, with their kill command as the custom action."""
    pytest.importorskip("google.protobuf")
    from tests.nvsentinel_stub import receive

    out = node["root"] / "events.json"
    r = cli_process("check", "gpu-node", "--ssh-config", node["cfg"], "--journal-directory",
                    str(node["root"] / "journal-live"), "--nvsentinel-events", out, "-f", "json", timeout=90)
    assert r.code == 1, r.stderr
    msg = receive(out.read_text())
    checks = {e.checkName: e for e in msg.events}
    orphan = checks["KvauditOrphanedEngineProcess"]
    assert not orphan.isHealthy and orphan.isFatal and f"kill {node['orphan']}" in orphan.message
    assert [(x.entityType, x.entityValue) for x in orphan.entitiesImpacted][0] == ("GPU", "3")
    idle = checks["KvauditIdleTenantMemory"]
    assert not idle.isHealthy and ("GPU", "5") in [(x.entityType, x.entityValue) for x in idle.entitiesImpacted]
