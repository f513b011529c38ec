"""kvaudit check on a TensorRT-LLM host: a real sshd on 127.0.0.1, the server's log in real journal files
(unit trtllm-serve.service, found by its name), nvidia-smi replaying an H100's readings."""

from __future__ import annotations

import pytest

from kvaudit.collect.commands import is_allowed
from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import FIXTURES, cli_limited, cli_process

pytestmark = [needs_sshd, needs_journal]

TRT_LOG = FIXTURES / "trtllm_classes" / "pytorch-1.2-llama31-8b-h100.log"
# CUDA total 81,090 MiB = 79.19 GiB (NVML total - reserved), as the log's "device total memory"
H100 = "0, GPU-h100-0000, NVIDIA H100 80GB HBM3, 00000000:19:00.0, 81559, 469, 74990, 6100, 580.95.05\n"
APPS = "51234, GPU-h100-0000, /usr/bin/python3, 74400\n"


@pytest.fixture(scope="module")
def trt_site(tmp_path_factory):
    with hostsim.ssh_site(tmp_path_factory.mktemp("trt"), "trt-test", TRT_LOG.read_bytes(), H100, APPS,
                          "trtllm-serve.service") as site:
        yield site


def test_trtllm_host_over_ssh(trt_site):
    host, cfg = trt_site
    before = host.snapshot()
    r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                    "--format", "json", timeout=60)
    assert r.code == ExitStatus.OK, r.stderr + r.stdout
    d = r.json()
    assert d["engine"] == "trtllm" and d["host"]["unit"] == "trtllm-serve.service"
    f = d["formula"]
    assert f["logged_tokens"] == 446208 and f["verdict"] == "match"
    gpu = d["gpus"][0]
    assert gpu["rank"] == "TP0" and gpu["mapped_by"] == "index order"
    assert gpu["pre_load_free_gib"] == pytest.approx(79.19)
    assert gpu["before_t_gib"] == pytest.approx(0.0, abs=0.01)  # the ledger's T is the card's CUDA total
    assert gpu["free_gib"] == pytest.approx(6100 / 1024, abs=0.01)
    for c in d["host"]["commands"]:
        assert is_allowed(c["command"]), c["command"]
    assert host.snapshot() == before


def test_trtllm_host_text_view(trt_site):
    host, cfg = trt_site
    r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal), timeout=60)
    assert r.code == ExitStatus.OK, r.stderr
    said = " ".join(r.stdout.split())  # the report wraps to the terminal's width
    assert "TensorRT-LLM 1.2.0" in said and "MATCH" in said and "GPUs now" in said


def test_trtllm_capture_then_replay(trt_site, tmp_path):
    host, cfg = trt_site
    out = tmp_path / "cap"
    r = cli_process("capture", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal), "-o", out,
                    timeout=60)
    assert r.code == 0, r.stderr
    d = cli_process("check", out, "--format", "json").json()
    assert d["engine"] == "trtllm" and d["formula"]["logged_tokens"] == 446208 and d["formula"]["verdict"] == "match"
    assert d["gpus"][0]["free_gib"] == pytest.approx(6100 / 1024, abs=0.01)


def test_non_finite_nvidia_smi_reading_is_partial_and_strict_json(trt_site):
    """A host whose nvidia-smi prints nan: the readings are dropped (partial, exit 6), the audit of the log
    stands, and the JSON holds no NaN (a strict parser reads it)."""
    import json

    host, cfg = trt_site
    csv = host.root / "smi" / "gpus.csv"
    good = csv.read_text()
    csv.write_text(good.replace("74990", "nan"))
    try:
        r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                        "--format", "json", timeout=60)
    finally:
        csv.write_text(good)
    assert r.code == ExitStatus.PARTIAL_DATA, r.stderr
    d = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert d["formula"]["verdict"] == "match" and any("not a reading" in p for p in d["host"]["partial"])


def test_a_batch_cut_short_is_retried_command_by_command(trt_site):
    """A host whose `hostname` kills the shell it runs in: the first round trip's batch stops there. The
    commands it never reached are run again one by one (the journal is read), not reported as "cannot read
    the journal"."""
    host, cfg = trt_site
    fake = host.bin / "hostname"
    # kill the shell that runs the batch (not sshd itself: that would be a dropped connection, another test)
    fake.write_text('#!/bin/sh\ncase "$(cat /proc/$PPID/comm)" in sh|bash|dash) kill -9 $PPID;; esac\necho gpu-host\n')
    fake.chmod(0o755)
    try:
        r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                        "--format", "json", timeout=60)
    finally:
        fake.unlink()
    assert r.code in (ExitStatus.OK, ExitStatus.PARTIAL_DATA), r.stderr + r.stdout
    d = r.json()
    assert d["formula"]["logged_tokens"] == 446208 and d["gpus"][0]["free_gib"] is not None


def test_a_host_flooding_stderr_does_not_grow_our_memory(trt_site):
    """journalctl writes 500 MB to stderr before its output (issue #10: a flood drove check past 1 GB). Only
    the head of stderr is kept, so the audit completes inside a 1 GiB address space."""
    host, cfg = trt_site
    fake = host.bin / "journalctl"
    fake.write_text("#!/bin/sh\nhead -c 500000000 /dev/zero | tr '\\\\0' x >&2\n"
                    "PATH=/usr/bin:/bin exec journalctl \"$@\"\n")
    fake.chmod(0o755)
    try:
        rc, err = cli_limited("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                               "--timeout", "90", "--format", "json", address_space=1 << 30)
    finally:
        fake.unlink()
    assert rc == ExitStatus.OK, err


def test_a_timed_out_log_read_is_a_timeout_and_leaves_nothing_running(trt_site):
    """journalctl hangs on the log read (a stuck journal): kvaudit reports a timeout, not "no engine lines",
    and nothing it started stays on the host: the remote pipeline runs under `timeout`, killed whole."""
    import subprocess
    import time

    host, cfg = trt_site
    fake = host.bin / "journalctl"
    fake.write_text('#!/bin/sh\ncase "$*" in *"-o cat"*) exec sleep 600.4242;; esac\n'
                    'PATH=/usr/bin:/bin exec journalctl "$@"\n')
    fake.chmod(0o755)

    def left() -> list[str]:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        # the marker of this test's stuck journalctl: its pipeline's process group dies with it, so the
        # marker alone proves nothing was left (a generic grep may belong to a test running beside this one)
        return [line for line in ps.splitlines() if "sleep 600.4242" in line]

    try:
        r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                        "--timeout", "6", "--format", "json", timeout=60)
        assert r.code == ExitStatus.UNREACHABLE, r.stderr + r.stdout
        assert r.json()["host"]["error"]["reason"] == "timeout"
        deadline = time.monotonic() + 20  # the remote limit (6 s + 1) and the kill-after (2 s) have to pass
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left() == []
    finally:
        fake.unlink()


def test_a_hostile_hostname_is_printed_as_text(trt_site):
    host, cfg = trt_site
    fake = host.bin / "hostname"
    fake.write_text("#!/bin/sh\nprintf 'gpu\\033]0;owned\\007\\033[2J\\302\\233' ; echo -host\n")
    fake.chmod(0o755)
    try:
        r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal), timeout=60)
    finally:
        fake.unlink()
    assert r.code == ExitStatus.OK, r.stderr
    assert not any(c in r.stdout for c in ("\x1b", "\x07", "\x9b")) and "gpu" in r.stdout


def test_a_host_is_the_name_it_was_given_not_the_one_it_reports(trt_site, tmp_path):
    """issue 21, item 5: a host answering `hostname` with another host's name takes neither that host's
    acknowledgements (--ignore CODE@gpu-02) nor its textfile (kvaudit-check-gpu-02.prom): it is 'trt-test', the
    name it was checked by. A real sshd, the host's own `hostname` replaced."""
    host, cfg = trt_site
    fake = host.bin / "hostname"
    fake.write_text("#!/bin/sh\necho gpu-02\n")
    fake.chmod(0o755)
    probe = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                        "-f", "json", timeout=60)
    code = next(f["code"] for f in probe.json()["findings"])
    try:
        r = cli_process("check", "trt-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                        "-f", "json", "--ignore", f"{code}@gpu-02", "--textfile-dir", tmp_path, timeout=60)
    finally:
        fake.unlink()
    assert r.code in (ExitStatus.OK, ExitStatus.WARNINGS), r.stderr
    (f,) = [f for f in r.json()["findings"] if f["code"] == code]
    assert f["ignored"] is False
    assert [p.name for p in tmp_path.glob("*.prom")] == ["kvaudit-check-trt-test.prom"]
