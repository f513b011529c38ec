"""A long-running server's journal is read through its startup's ready line (kvaudit.collect.commands.StartupWindow):
real journal files (systemd-journal-remote), a real sshd on 127.0.0.1, the real CLI; and the stop rule's awk run over
every real log of the repository that has a ready line."""

from __future__ import annotations

import io
from dataclasses import replace
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit import explain as X
from kvaudit.collect import commands as C
from kvaudit.engines import startup_window
from kvaudit.parse.lines import InputError
from kvaudit.reconcile.interface import AuditOptions
from tests import hostsim
from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import FIXTURES, KIMI_LOG, cli_process

ROOT = FIXTURES.parent
sys.path.insert(0, str(ROOT / "bench"))
from genlog import filler_block  # noqa: E402

READY_LINE = 165  # the Kimi log's "The server is fired up and ready to roll!" (uvicorn's own line is 161)
#: a line after the ready line that kvaudit's anchors select ("GB") and its audit does not change: the full
#: read receives it, the window read does not
AFTER_READY = (b"2026-02-25T10:30:00+0000 gpu-node-07 python3[48211]: [2026-02-25 10:30:00 TP0] Cache flushed: "
               b"1.00 GB of host memory released")
SERVING = filler_block(7, 600 << 10).rstrip(b"\n").split(b"\n")  # ~2,900 decode, prefill and HTTP lines


def _journal(site, name: str, tail: list[bytes]) -> Path:
    kimi = KIMI_LOG.read_bytes().replace(b"/models/moonshotai/Kimi-K2.5", str(site.host.model_dir).encode())
    lines = kimi.rstrip(b"\n").split(b"\n")
    assert b"fired up and ready to roll" in lines[READY_LINE - 1]
    d = site.root / name
    if not d.exists():
        hostsim.write_journal(d, hostsim.export_entries(lines + [AFTER_READY] + SERVING + tail, "sglang.service",
                                                        "f" * 32, 48190, 1_771_900_000_000_000))
    return d


def _check(site, journal: Path, tmp_path: Path, name: str):
    cfg = site.trusted_config()
    r = cli_process("check", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(journal), "--format", "json",
                    timeout=120)
    out = tmp_path / name
    c = cli_process("capture", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(journal), "--output", str(out),
                    timeout=120)
    assert c.code == 0, c.stderr
    numbers = [int(line.partition(b":")[0]) for line in (out / "log.txt").read_bytes().split(b"\n") if line]
    return r, numbers


def _audit(d: dict) -> dict:
    """The check's JSON without what says how it was read (commands, bytes, seconds, the journal's path)."""
    d = json.loads(json.dumps(d))
    host = d.pop("host")
    for key in ("unit", "invocation_id", "config_source", "partial", "gpu_source"):
        d[key] = host.get(key)
    return json.loads(json.dumps(d).replace(str(host.get("source", "")), "SOURCE"))


@needs_sshd
@needs_journal
def test_a_serving_journal_is_read_through_its_ready_line_with_the_same_audit(site, tmp_path):
    """Same startup and serving: one journal's last lines are serving only (the read stops at the ready line),
    the other's last line says a request was aborted (a tail word: read to the end, as before). The audits are
    the same; the first read did not receive the anchored line after the ready line, the second did."""
    window, window_lines = _check(site, _journal(site, "journal-window", []), tmp_path, "window")
    full, full_lines = _check(site, _journal(site, "journal-window-full", [
        b"2026-02-25T12:00:00+0000 gpu-node-07 python3[48190]: [2026-02-25 12:00:00] Request 7f3a aborted by the "
        b"client"]), tmp_path, "full")
    assert window.code == full.code == 0, window.stderr + full.stderr
    assert window.json()["formula"]["logged_tokens"] == 159277
    assert _audit(window.json()) == _audit(full.json())
    after = len(KIMI_LOG.read_bytes().rstrip(b"\n").split(b"\n")) + 1  # AFTER_READY's line
    assert max(window_lines) <= READY_LINE and after not in window_lines
    assert after in full_lines and set(window_lines) == set(full_lines) - {after}
    ran = " ".join(c["command"] for c in window.json()["host"]["commands"])
    assert "_SYSTEMD_INVOCATION_ID=" + "f" * 32 in ran


@needs_journal
def test_the_window_script_as_one_command_gives_the_host_scripts_lines(site):
    """The command the session runs when a host's shell refuses the host script (command by command) reads the
    same lines: it stops at the ready line where the tail is serving, reads it all where it is not."""
    anchors = (b"GB", b"KV ", b"fired up")
    for name, stops in (("journal-window", True), ("journal-window-full", False)):
        d = site.root / name
        if not d.exists():
            pytest.skip("built by the test above")
        cmd = C.journal_lines("sglang.service", "f" * 32, str(d), anchors, startup_window())
        assert C.is_allowed(cmd)
        plain = C.journal_lines("sglang.service", "f" * 32, str(d), anchors)
        got = subprocess.run(["sh", "-c", cmd], capture_output=True, check=True).stdout
        everything = subprocess.run(["sh", "-c", plain], capture_output=True, check=True).stdout
        numbers = [int(x.partition(b":")[0]) for x in got.split(b"\n") if x]
        if stops:
            assert max(numbers) == READY_LINE and everything.startswith(got) and len(everything) > len(got)
        else:
            assert got == everything


#: the notes an audit gives lines past its server's ready line: a failure while serving (kvaudit.explain), error
#: lines set aside as a serving server's (kvaudit.parse.request_time), memory lines after serving
AFTER_SERVING = ("the server failed after it began serving", "after the startup was complete",
                 "after the server began serving")


def _audits(data: bytes) -> str:
    """The audits of ``data``, less the last startup's span end: a startup's span runs to the end of what was read
    (the next start or the input's end), so a read stopped at the ready line ends its span there; every figure,
    finding and note must be the same."""
    try:
        log = X.read_log(io.BytesIO(data))
        audits = X.audit(log, AuditOptions(), all_startups=True)
        # a failure after the server began serving lies past the ready line, where a stopped read ends; the host
        # script reads such an invocation whole (its tail holds the failure: the test below checks that)
        audits = [replace(a, notes=tuple(n for n in a.notes if not any(w in n for w in AFTER_SERVING)))
                  for a in audits]
        return repr((log.engine.name, [*audits[:-1], *(replace(a, last_line=0) for a in audits[-1:])]))
    except InputError as exc:
        return f"error: {exc}"


REAL_LOGS = sorted([*(FIXTURES / "corpus").glob("*.log"), *(FIXTURES / "samples").glob("*.log"),
                    *FIXTURES.glob("*_classes/*.log"), *(FIXTURES / "journal_logs").glob("*.log")])


def test_every_real_log_stopped_at_its_ready_line_audits_as_the_whole_log():
    """The stop rule (STOP_AWK, with the registry's markers and ready lines) over every real log of the repository:
    where it stops early, the lines it passed audit exactly as the whole log; SGLang's stop is its own ready line,
    never uvicorn's (its warm-up is logged between the two)."""
    lines, words, markers, ready = startup_window().args
    stopped = 0
    for path in REAL_LOGS:
        data = path.read_bytes()
        passed = subprocess.run(["awk", "-v", f"m={markers}", "-v", f"r={ready}", C.STOP_AWK], input=data,
                                capture_output=True, check=True).stdout
        assert data.startswith(passed.rstrip(b"\n")), path.name
        if len(passed.rstrip(b"\n")) == len(data.rstrip(b"\n")):
            continue
        stopped += 1
        last = passed.rstrip(b"\n").rsplit(b"\n", 1)[-1]
        assert last.endswith((b"The server is fired up and ready to roll!", b"Available routes are:",
                              b"Application startup complete.")), (path.name, last)
        if b"server_args=" in passed:
            assert last.endswith(b"fired up and ready to roll!"), path.name
        assert _audits(passed) == _audits(data), path.name
        whole = repr(X.audit(X.read_log(io.BytesIO(data)), AuditOptions()))
        if any(w in whole for w in AFTER_SERVING):
            tail = b"\n".join(data.rstrip(b"\n").split(b"\n")[-int(lines):]) + b"\n"
            assert subprocess.run(["awk", "-v", f"w={words}", C.TAIL_AWK], input=tail).returncode == 0, path.name
    assert stopped >= 25  # SGLang, vLLM and TensorRT-LLM logs with their ready lines


def test_the_gate_takes_the_window_script_only_as_built():
    w = startup_window()
    good = C.journal_lines("sglang.service", "f" * 32, None, (b"GB",), w)
    assert C.is_allowed(good)
    argv = shlex.split(good)
    for i, bad in ((5, "_SYSTEMD_UNIT=x"), (6, "0"), (7, "error\\nx"), (8, "0\tx\t"), (9, "x\tready"),
                   (4, "relative/dir"), (2, argv[2] + "; touch /tmp/x")):
        mutated = list(argv)
        mutated[i] = bad
        assert not C.is_allowed(shlex.join(mutated)), (i, bad)
    with pytest.raises(ValueError):
        C.StartupWindow(ready=((0, "a\\b"),))
