"""The health-check contract (issue 24, item 1) on a real sshd and journal: one JSON verdict, a node problem
(foreign memory, unreadable GPUs) critical, a config problem never more than a warning (exit 0 on the npd scale),
a host that cannot be audited unknown, and a usage error unknown too (never read as CRITICAL)."""

from __future__ import annotations

from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import cli, cli_process

pytestmark = [needs_sshd, needs_journal]

SCHEMA_KEYS = {"schema", "host", "engine", "engine_version", "state", "exit_status", "exit_codes", "headline",
               "node_problems", "config_problems", "ignored", "problems"}


def health(site, *args):
    cfg = site.trusted_config()
    return cli_process("check", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(site.host.journal),
                       "--health-check", "--format", "json", "--timeout", "60", *args, timeout=90)


def test_a_healthy_host_is_ok_on_both_scales(site):
    r = health(site)
    assert r.code == 0, r.stderr
    d = r.json()
    assert set(d) == SCHEMA_KEYS and d["schema"] == "kvaudit.health/1"
    assert d["host"] == "gpu-test" and d["engine"] == "sglang" and d["state"] == "ok" and d["problems"] == []
    assert d["headline"].startswith("OK 159,277 tokens")
    assert health(site, "--exit-codes", "npd").code == 0


def test_a_foreign_process_on_a_gpu_is_a_node_problem(site):
    apps = site.host.root / "smi" / "apps.csv"
    real = apps.read_text()
    apps.write_text(real + "9999, GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c000003, python3 train.py, 4096\n")
    try:
        r = health(site)
        assert r.code == 2, r.stdout  # CRITICAL
        d = r.json()
        foreign = next(p for p in d["problems"] if p["code"] == "FOREIGN_PROCESS")
        assert foreign["problem"] == "node" and "nvidia-smi" in foreign["action"]
        assert d["state"] == "critical" and d["node_problems"] >= 1
        assert health(site, "--exit-codes", "npd").code == 1
        # the status line NPD and Nagios read (issue 37): the GPU, the amount and the pid, in 80 bytes
        r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                        str(site.host.journal), "--health-check", "--exit-codes", "npd", "--timeout", "60", timeout=90)
        assert r.code == 1 and r.stdout == "KVAUDIT CRITICAL - GPU 3: 4.0 GiB held by pid 9999 (not the engine)\n"
    finally:
        apps.write_text(real)


def test_unreadable_gpus_are_a_node_problem(site):
    site.host.set_smi_mode("fail")
    try:
        r = health(site, "--exit-codes", "npd")
        d = r.json()
        assert r.code == 1 and d["state"] == "critical", d
        assert any(p["code"] == "GPU_READINGS_MISSING" and p["problem"] == "node" for p in d["problems"])
    finally:
        site.host.set_smi_mode("ok")


def test_a_config_warning_never_drains_the_node(site):
    """The fraction given on the command line is not the server's: the pool does not follow the formula, a
    config problem: a warning on the Nagios scale, nothing on the npd scale."""
    r = health(site, "--mem-fraction-static", "0.5")
    d = r.json()
    assert r.code == 1 and d["state"] == "warning", d
    assert d["problems"] and all(p["problem"] == "config" for p in d["problems"])
    assert health(site, "--mem-fraction-static", "0.5", "--exit-codes", "npd").code == 0


def test_a_host_that_cannot_be_audited_is_unknown(site, tmp_path):
    cfg = site.ssh_config("closed", port=1, extra="")
    r = cli_process("check", "gpu-test", "--ssh-config", cfg, "--health-check", "-f", "json", timeout=60)
    assert r.code == 3 and r.json()["state"] == "unknown"
    r = cli_process("check", "gpu-test", "--ssh-config", cfg, "--health-check", "--exit-codes", "npd", timeout=60)
    assert r.code == 2 and r.stdout.startswith("KVAUDIT UNKNOWN - ") and len(r.stdout.strip().encode()) <= 80


def test_a_usage_error_is_unknown_on_the_scale():
    """A check that did not run says so on stderr and still prints its verdict on stdout in the scale's contract
    (ux-audit2 item 14: Nagios shows "(No output on stdout)" otherwise), and exits UNKNOWN (Nagios 3, npd 2),
    not 2, which the Nagios scale reads as CRITICAL (the usage error's own status elsewhere)."""
    for args, code in ((("--format", "markdown"), 3), (("--exit-codes", "npd", "--timeout", "soon"), 2),
                       (("--exit-codes", "sometimes"), 3)):
        r = cli("check", "local", "--health-check", *args)
        assert r.code == code, args
        line = r.stdout.splitlines()[0].split(" | ")[0]
        assert line.startswith("KVAUDIT UNKNOWN - not run: ") and len(line.encode()) <= 80, (args, line)
        assert "error" in r.stderr
    assert "'soon'" in cli("check", "local", "--health-check", "--timeout", "soon").stdout
    assert cli("check", "local", "--timeout", "soon").code == 2


def test_refused_settings_still_print_the_status_line(tmp_path, monkeypatch):
    """A ./kvaudit.toml that acknowledges a failed start is refused (ux-audit2 item 14): the health check exits
    UNKNOWN with its status line naming the refusal on stdout, and with --format json the health document."""
    from tests.conftest import FIXTURES

    (tmp_path / "kvaudit.toml").write_text('ignore = ["STARTUP_FAILED"]\n')
    monkeypatch.chdir(tmp_path)
    host = str(FIXTURES / "hosts" / "kimi-k25-tp8")
    r = cli("check", host, "--health-check")
    line = r.stdout.splitlines()[0]
    assert r.code == 3 and line.startswith("KVAUDIT UNKNOWN - not run: kvaudit.toml: ignore entry 1: STARTUP_FAILED")
    assert len(line.split(" | ")[0].encode()) <= 80 and "cannot be acknowledged" in r.stderr
    r = cli("check", host, "--health-check", "--exit-codes", "npd", "-f", "json")
    d = r.json()
    assert (r.code, d["state"], d["exit_status"], d["host"]) == (2, "unknown", 2, host)
    assert "STARTUP_FAILED" in d["headline"]


def test_an_unreachable_endpoint_keeps_its_cause_in_80_bytes():
    """The unknown line of a target that refused the connection keeps the cause, not the URL on-call already
    knows (ux-audit2 item 15: it was ``failed: unreachable: http://127.0.0.1:1/server_info...``)."""
    r = cli("check", "http://127.0.0.1:1", "--health-check", "--exit-codes", "npd", "--timeout", "30")
    line = r.stdout.strip()
    assert r.code == 2 and len(line.encode()) <= 80, line
    assert line.startswith("KVAUDIT UNKNOWN - unreachable: ") and "refused" in line.lower(), line
