"""kvaudit check against a real sshd on 127.0.0.1, through the real CLI; every fault has a clean outcome."""

from __future__ import annotations

import socket
import threading
import re
import time

import json
import os

import pytest

from kvaudit.collect.commands import is_allowed
from kvaudit.status import ExitStatus
from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import KIMI_LOG, cli_process

pytestmark = [needs_sshd, needs_journal]


def check(site, *args, cfg=None, timeout=60):
    cfg = cfg or site.trusted_config()
    return cli_process("check", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(site.host.journal),
                       *args, timeout=timeout)


def test_kimi_over_ssh_reconciles_all_8_gpus(site):
    before = site.host.snapshot()
    r = check(site, "--format", "json")
    assert r.code == ExitStatus.OK, r.stderr
    d = r.json()
    f = d["formula"]
    assert f["logged_tokens"] == 159277 and f["verdict"] == "match"
    assert f["bytes_per_token"] == 70272 and f["bytes_per_token_source"] == "config"
    assert d["host"]["config_source"] == f"{site.host.model_dir}/config.json"
    assert "RESERVE_EXPLAINS_FREE" in {x["code"] for x in d["findings"]}
    assert [g["rank"] for g in d["gpus"]] == [f"TP{i}" for i in range(8)]
    assert all(g["mapped_by"] == "process name" for g in d["gpus"])
    assert d["gpus"][0]["before_t_gib"] == pytest.approx(1.55, abs=0.01)
    # the journal holds two starts of the unit; only the latest invocation's lines crossed
    assert d["startup"]["total"] == 1 and d["host"]["invocation_id"] == "b" * 32
    assert d["host"]["unit"] == "sglang.service"  # found in the journal, not given
    assert 0 < d["host"]["bytes_received"] < 64 << 10
    for c in d["host"]["commands"]:
        assert is_allowed(c["command"]), c["command"]
    assert site.host.snapshot() == before  # nothing on the host changed


def test_text_view_over_ssh(site):
    r = check(site)
    assert r.code == 0
    assert "GPUs now" in r.stdout and "MATCH" in r.stdout and "bytes in" in r.stdout


def test_unknown_host_key_refused_then_accepted_and_recorded(site):
    cfg = site.ssh_config("unknown")
    kh = site.root / "unknown.known_hosts"
    kh.unlink(missing_ok=True)
    r = check(site, cfg=cfg)
    assert r.code == ExitStatus.AUTH_REFUSED
    assert "not known" in r.stderr and "--accept-new-host-key" in r.stderr and r.stdout == ""
    assert not kh.exists()
    r = check(site, "--accept-new-host-key", cfg=cfg)
    assert r.code == ExitStatus.OK, r.stderr
    assert site.sshd.host_pub.split()[1] in kh.read_text()
    assert f"[127.0.0.1]:{site.sshd.port}" in kh.read_text()
    assert check(site, cfg=cfg).code == ExitStatus.OK  # now known


def test_changed_host_key_always_refused(site, tmp_path):
    from tests.hostsim import keygen

    other = keygen(tmp_path / "other")
    cfg = site.ssh_config("changed")
    (site.root / "changed.known_hosts").write_text(f"[127.0.0.1]:{site.sshd.port} {' '.join(other.split()[:2])}\n")
    r = check(site, "--accept-new-host-key", cfg=cfg)
    assert r.code == ExitStatus.AUTH_REFUSED and "CHANGED" in r.stderr


def test_tolerant_known_hosts_hashed_wildcard_and_cert_authority(site):
    import base64
    import hashlib
    import hmac

    name = f"[127.0.0.1]:{site.sshd.port}"
    salt = b"0123456789abcdefghij"
    digest = base64.b64encode(hmac.new(salt, name.encode(), hashlib.sha1).digest()).decode()
    for entry in (f"|1|{base64.b64encode(salt).decode()}|{digest} {site.sshd.host_pub}",
                  f"[127.0.0.*]:{site.sshd.port} {site.sshd.host_pub}"):
        cfg = site.ssh_config("tolerant")
        (site.root / "tolerant.known_hosts").write_text(
            "@cert-authority *.example.com ssh-ed25519 AAAAnotbase64!!\n# comment\ngarbage\n" + entry + "\n")
        r = check(site, cfg=cfg)
        assert r.code == ExitStatus.OK, (entry, r.stderr)


def test_connection_refused(site):
    from tests.hostsim import closed_port

    held, port = closed_port()
    cfg = site.ssh_config("refused", port=port)
    r = check(site, cfg=cfg, timeout=30)
    held.close()
    assert r.code == ExitStatus.UNREACHABLE and "refused" in r.stderr


def test_blackholed_connect_times_out(site):
    """A port that accepts TCP but never speaks SSH (a blackholed service): bounded by the connect timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    conns = []
    threading.Thread(target=lambda: conns.append(srv.accept()), daemon=True).start()
    cfg = site.ssh_config("blackhole", port=srv.getsockname()[1])
    t = time.monotonic()
    r = check(site, "--connect-timeout", "1.5", cfg=cfg, timeout=30)
    assert r.code == ExitStatus.UNREACHABLE and "within" in r.stderr
    assert time.monotonic() - t < 15
    srv.close()


def test_authentication_refused(site, tmp_path):
    from tests.hostsim import keygen

    keygen(tmp_path / "stranger")
    cfg = site.ssh_config("auth", key=tmp_path / "stranger")
    (site.root / "auth.known_hosts").write_text(f"[127.0.0.1]:{site.sshd.port} {site.sshd.host_pub}\n")
    r = check(site, cfg=cfg)
    assert r.code == ExitStatus.AUTH_REFUSED and "authentication" in r.stderr


def test_remote_command_hanging_past_the_deadline(site):
    """A hung nvidia-smi costs the readings, never the audit of the log already read (issue 39, item 5: it was
    exit 4 at the host deadline): each call is bounded on the host within the deadline."""
    site.host.set_smi_mode("hang")
    try:
        t = time.monotonic()
        # 9 s: nvidia-smi gets its floor (SMI_MIN_S, 3 s) and the connection, the log and the audit the rest; at
        # 4 s only ~1 s was left for them and a loaded two-core box ran past the deadline
        r = check(site, "--timeout", "9")
        assert r.code == ExitStatus.PARTIAL_DATA and "nvidia-smi failed: no answer within" in r.stdout, r
        assert r.stdout.startswith("PARTIAL 159,277 tokens")
        assert time.monotonic() - t < 15
    finally:
        site.host.set_smi_mode("ok")


def test_connection_dropped_mid_output(site):
    site.host.set_smi_mode("drop")
    try:
        r = check(site)
        assert r.code == ExitStatus.UNREACHABLE and "dropped" in r.stderr
    finally:
        site.host.set_smi_mode("ok")


@pytest.mark.parametrize("journal,message", [
    ("/nonexistent/journal", "journal"),
    ("journal-empty", "no systemd unit"),
    ("journal-other", "no systemd unit"),
])
def test_journal_unreadable_or_empty(site, journal, message):
    path = journal if journal.startswith("/") else str(site.host.root / journal)
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory", path)
    assert r.code == ExitStatus.PARTIAL_DATA and message in r.stderr, r.stderr


def test_nvidia_smi_failing_gives_partial_data(site):
    site.host.set_smi_mode("fail")
    try:
        r = check(site, "--format", "json")
        assert r.code == ExitStatus.PARTIAL_DATA
        d = r.json()
        assert "NVIDIA-SMI has failed" in d["host"]["partial"][0]
        assert d["formula"]["verdict"] == "match" and d["gpus"] == []
    finally:
        site.host.set_smi_mode("ok")


def test_nvidia_smi_missing_gives_partial_data(site):
    smi = site.host.bin / "nvidia-smi"
    saved = smi.read_bytes()
    smi.unlink()
    try:
        r = check(site, "--format", "json")
        assert r.code == ExitStatus.PARTIAL_DATA
        assert "nvidia-smi not found" in r.json()["host"]["partial"][0]
    finally:
        smi.write_bytes(saved)
        smi.chmod(0o755)


def test_config_json_missing_falls_back_to_the_kv_line(site):
    cfg = site.host.model_dir / "config.json"
    saved = cfg.read_bytes()
    cfg.unlink()
    try:
        r = check(site, "--format", "json")
        assert r.code == ExitStatus.PARTIAL_DATA
        d = r.json()
        assert d["formula"]["bytes_per_token_source"] == "kv_line"
        assert any("config.json" in p for p in d["host"]["partial"])
    finally:
        cfg.write_bytes(saved)


def test_a_50_mb_journal_line_is_cut_on_the_host(site):
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                    str(site.host.root / "journal-big"), "--format", "json")
    assert r.code == ExitStatus.OK, r.stderr
    d = r.json()
    assert d["formula"]["logged_tokens"] == 159277
    assert d["host"]["bytes_received"] < 2 << 20  # 1 MiB of the 50 MB line at most


def test_proxyjump_through_a_bastion(site):
    cfg = site.trusted_config("jump")
    text = cfg.read_text().replace("Host gpu-test", "Host gpu-test\n    ProxyJump bastion")
    text += text.split("Host gpu-test")[1].replace("    ProxyJump bastion\n", "").join(["Host bastion", ""])
    cfg.write_text(text)
    r = check(site, cfg=cfg)
    assert r.code == ExitStatus.OK, r.stderr


def test_capture_over_ssh_then_replay(site, tmp_path):
    out = tmp_path / "cap"
    r = cli_process("capture", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                    str(site.host.journal), "-o", out)
    assert r.code == 0, r.stderr
    live = check(site, "--format", "json").json()
    replay = cli_process("check", out, "--format", "json")
    assert replay.code == 0
    d = replay.json()
    for key in ("logged_tokens", "predicted_tokens", "verdict", "bytes_per_token"):
        assert d["formula"][key] == live["formula"][key]
    assert [g["free_gib"] for g in d["gpus"]] == [g["free_gib"] for g in live["gpus"]]


def test_source_file_on_the_host(site):
    log = site.host.root / "sglang.log"
    log.write_bytes(KIMI_LOG.read_bytes().replace(b"/models/moonshotai/Kimi-K2.5", str(site.host.model_dir).encode()))
    before = site.host.snapshot()
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--source", f"file:{log}",
                    "--format", "json")
    assert r.code == ExitStatus.OK, r.stderr
    d = r.json()
    assert d["host"]["source"] == f"file:{log}" and d["formula"]["logged_tokens"] == 159277
    assert site.host.snapshot() == before


def test_proxycommand(site):
    import shutil

    if shutil.which("ssh") is None:
        pytest.skip("openssh-client not installed")
    cfg = site.trusted_config("proxycmd")
    kh = site.root / "proxycmd.known_hosts"
    cfg.write_text(cfg.read_text() + f"    ProxyCommand ssh -q -i {site.key} -o IdentitiesOnly=yes -o BatchMode=yes "
                   f"-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -p {site.sshd.port} "
                   f"-W %h:%p 127.0.0.1\n")
    r = check(site, cfg=cfg)
    assert r.code == ExitStatus.OK, r.stderr


def test_host_keys_compared_by_type_as_openssh_does(site, tmp_path):
    """A host pinned only by its RSA key (it also has an ed25519 one): the pinned type is negotiated and the
    host is known. A host that has no key of the pinned type offers a different key: a changed key, refused
    even with --accept-new-host-key, and known_hosts is left alone."""
    from tests import hostsim

    two = hostsim.start_sshd(tmp_path / "two", (site.root / "client_key.pub").read_text().strip(),
                             [site.host.bin], key_types=("ed25519", "rsa"))
    one = hostsim.start_sshd(tmp_path / "one", (site.root / "client_key.pub").read_text().strip(),
                             [site.host.bin], key_types=("ed25519",))
    try:
        for sshd, name, pinned in ((two, "rsa-only", two.host_pubs["rsa"]),
                                   (one, "changed-type", two.host_pubs["rsa"])):
            kh = tmp_path / f"{name}.known_hosts"
            kh.write_text(f"[127.0.0.1]:{sshd.port} {pinned}\n")
            cfg = site.ssh_config(name, known_hosts=str(kh), port=sshd.port)
            if sshd is two:
                r = check(site, "--format", "json", cfg=cfg)
                assert r.code == ExitStatus.OK, r.stderr
            else:
                before = kh.read_text()
                r = check(site, "--accept-new-host-key", cfg=cfg)
                assert r.code == ExitStatus.AUTH_REFUSED and "CHANGED" in r.stderr, r.stderr
                assert kh.read_text() == before
    finally:
        two.stop()
        one.stop()


def test_a_connection_closed_between_commands_is_reopened_once(site):
    """The server closes the connection while no command runs (seen under load: the server side went away
    after a command): the next command runs on a new connection, once; a second close is a drop."""
    from kvaudit.collect.interface import ConnectionDropped
    from kvaudit.collect.ssh import SSHRunner

    runner = SSHRunner("gpu-test", str(site.trusted_config("reopen")), deadline_s=60)
    try:
        assert runner.run("hostname", 20, 1 << 20).rc == 0
        runner.client.get_transport().close()
        again = runner.run("hostname", 20, 1 << 20)
        assert again.rc == 0 and again.stdout.strip() and runner.reconnected
        runner.client.get_transport().close()
        with pytest.raises(ConnectionDropped, match="after one reconnect"):
            runner.run("hostname", 20, 1 << 20)
    finally:
        runner.close()


def test_a_runner_closed_by_ctrl_c_is_never_reopened(site):
    from kvaudit.collect import ssh
    from kvaudit.collect.interface import ConnectionDropped

    runner = ssh.SSHRunner("gpu-test", str(site.trusted_config("cancel")), deadline_s=60)
    try:
        ssh.close_all()
        with pytest.raises(ConnectionDropped, match="interrupted"):
            runner.run("hostname", 20, 1 << 20)
    finally:
        runner.close()


def test_a_unit_that_does_not_exist_lists_the_engine_units_there(site):
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                    str(site.host.journal), "--unit", "vllm.service")
    assert r.code == ExitStatus.PARTIAL_DATA, r.stderr
    assert "there is no unit 'vllm.service' in the journal; engine-like units there: sglang.service" in r.stderr


def test_a_journal_the_login_user_may_not_read_is_its_own_reason(site):
    """journalctl's own words for a user outside the journal groups (a stand-in journalctl prints them: the
    tests run as root): reason journal_denied, the groups named, exit 5, not "no engine"."""
    fake = site.host.bin / "journalctl"
    fake.write_text("#!/bin/sh\ncase \"$*\" in *_SYSTEMD_INVOCATION_ID=*|*--unit=*)\n"
                    "echo 'Hint: You are currently not seeing messages from other users and the system.' >&2\n"
                    "echo \"      Users in groups 'adm', 'systemd-journal' can see all messages.\" >&2\n"
                    "echo '      Pass -q to turn off this notice.' >&2\n"
                    "echo 'No journal files were opened due to insufficient permissions.' >&2; exit 0;;\n"
                    "esac\nPATH=/usr/bin:/bin exec journalctl \"$@\"\n")
    fake.chmod(0o755)
    try:
        r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                        str(site.host.journal))
    finally:
        fake.unlink()
    assert r.code == ExitStatus.AUTH_REFUSED and "journal_denied" in r.stderr, r.stderr
    assert "adm, systemd-journal" in r.stderr and "no_engine" not in r.stderr


def test_a_missing_source_file_says_so(site):
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--source", "file:/nope/server.log")
    assert r.code == ExitStatus.PARTIAL_DATA and "file:/nope/server.log: the file does not exist" in r.stderr


def test_no_authentication_method_is_an_auth_failure(site, tmp_path):
    cfg = tmp_path / "noauth"
    cfg.write_text(f"Host gpu-test\n  HostName 127.0.0.1\n  Port {site.sshd.port}\n  User nobody\n"
                   f"  IdentitiesOnly yes\n  IdentityFile {tmp_path}/no-such-key\n"
                   f"  UserKnownHostsFile {site.root}/trusted.known_hosts\n")
    site.trusted_config()
    env_agent = os.environ.pop("SSH_AUTH_SOCK", None)
    try:
        r = cli_process("check", "gpu-test", "--ssh-config", cfg)
    finally:
        if env_agent is not None:
            os.environ["SSH_AUTH_SOCK"] = env_agent
    assert r.code == ExitStatus.AUTH_REFUSED and "auth" in r.stderr, r.stderr


def test_a_missing_ssh_config_is_a_usage_error(tmp_path):
    r = cli_process("check", "gpu-test", "--ssh-config", tmp_path / "nope")
    assert r.code == ExitStatus.BAD_INPUT and "--ssh-config" in r.stderr


def test_no_engine_log_still_shows_what_was_read(site, tmp_path):
    """A journal without the engine (another unit only): no audit, but the GPUs, the processes and the
    commands run are in every report, and a capture keeps them, saying the log was missing (issue 11, 12)."""
    other = str(site.host.root / "journal-other")
    r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory", other,
                    "--format", "json")
    assert r.code == ExitStatus.PARTIAL_DATA and "no_engine" in r.stderr
    d = r.json()
    assert d["formula"] is None and d["host"]["error"]["reason"] == "no_engine"
    assert len(d["gpus"]) == 8 and d["gpus"][0]["free_gib"] is not None and d["host"]["commands"]
    assert d["host"]["partial"][0].startswith("no engine log: ")
    text = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory", other)
    assert "FAILED [no_engine]" in text.stdout and "GPUs now" in text.stdout
    cap = cli_process("capture", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory", other,
                      "-o", tmp_path / "cap")
    assert cap.code == ExitStatus.PARTIAL_DATA and "partial: no engine log" in cap.stdout
    assert (tmp_path / "cap" / "nvidia-smi-gpus.csv").read_text().count("\n") == 8
    again = cli_process("check", tmp_path / "cap", "--format", "json")
    assert again.code == ExitStatus.PARTIAL_DATA and len(again.json()["gpus"]) == 8


def test_ssh_config_is_read_as_openssh_reads_it(site, tmp_path):
    """Include and Match (which paramiko's reader does not do) resolve through OpenSSH's own ssh -G."""
    extra = tmp_path / "conf.d" / "gpu.conf"
    extra.parent.mkdir()
    extra.write_text(f"Host gpu-inc\n  HostName 127.0.0.1\n  Port {site.sshd.port}\n")
    known = site.known_hosts(tmp_path / "known_hosts")
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {extra.parent}/*.conf\n"
                   f"Match host 127.0.0.1\n  IdentityFile {site.key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {known}\n  User {os.environ.get('USER') or 'root'}\n")
    r = cli_process("check", "gpu-inc", "--ssh-config", cfg, "--journal-directory", str(site.host.journal),
                    "--format", "json")
    assert r.code == ExitStatus.OK, r.stderr
    assert r.json()["formula"]["logged_tokens"] == 159277


def test_an_ssh_config_ssh_rejects_names_the_file_and_option(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text("Host gpu-x\n  HostName 127.0.0.1\n  Prot 22\n")
    r = cli_process("check", "gpu-x", "--ssh-config", cfg)
    assert r.code == ExitStatus.BAD_INPUT and "ssh_config" in r.stderr
    assert str(cfg) in r.stderr and "option: prot" in r.stderr and "line 3" in r.stderr


def test_without_the_ssh_client_the_own_reader_gives_the_same_host(site, monkeypatch):
    """The fallback reader (no ssh client) and ssh -G agree on a plain config."""
    from kvaudit.collect.ssh import resolve

    cfg = str(site.trusted_config("plain"))
    by_openssh = resolve("gpu-test", cfg)
    monkeypatch.setenv("KVAUDIT_NO_SSH_G", "1")
    by_paramiko = resolve("gpu-test", cfg)
    assert by_openssh == by_paramiko


def test_an_inventory_key_file_is_tried_first(site, tmp_path):
    """ansible_ssh_private_key_file reaches the connection (as ssh -i): a config that offers no key works
    with it, and fails without it."""
    from kvaudit.collect.interface import AuthFailed
    from kvaudit.collect.ssh import SSHRunner

    known = site.known_hosts(tmp_path / "known_hosts")
    cfg = tmp_path / "config"
    cfg.write_text(f"Host gpu-key\n  HostName 127.0.0.1\n  Port {site.sshd.port}\n  IdentitiesOnly yes\n"
                   f"  IdentityFile {tmp_path}/absent\n  UserKnownHostsFile {known}\n"
                   f"  User {os.environ.get('USER') or 'root'}\n")
    with pytest.raises(AuthFailed):
        SSHRunner("gpu-key", str(cfg), deadline_s=30).close()
    runner = SSHRunner("gpu-key", str(cfg), deadline_s=30, identity_file=str(site.key))
    try:
        assert runner.run("hostname", 20, 1 << 20).rc == 0
    finally:
        runner.close()


def test_ctrl_c_in_fleet_closes_the_ssh_session_at_once(site, tmp_path):
    """A fleet stuck on a host whose nvidia-smi hangs (30 s): Ctrl-C closes the SSH session, the report shows
    the host as interrupted, exit 130, well before the hang ends; no traceback."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    marker = site.host.root / "smi" / "hanging"
    marker.unlink(missing_ok=True)
    site.host.set_smi_mode("hang")
    inv = tmp_path / "hosts.txt"
    inv.write_text("gpu-test\n")
    exe = Path(sys.executable).with_name("kvaudit")
    p = subprocess.Popen([str(exe), "fleet", str(inv), "--ssh-config", str(site.trusted_config()), "--timeout", "60",
                          "-f", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)  # polling for the host's own signal that the command is running
        assert marker.exists()
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        site.host.set_smi_mode("ok")
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert json.loads(out)["hosts"][0]["summary"]["status"] == "failed:interrupted"
    assert took < 10, took


def test_ssh_configs_strict_host_key_checking_is_honoured(site):
    """issue 24, item 6: StrictHostKeyChecking accept-new in ssh_config trusts an unknown key on first use as
    --accept-new-host-key does (recorded in its UserKnownHostsFile); yes refuses it; a changed key is refused
    whatever ssh_config says (no included)."""
    from tests.hostsim import keygen

    kh = site.root / "shkc.known_hosts"
    kh.unlink(missing_ok=True)
    strict = site.ssh_config("shkc-yes", known_hosts=str(kh), extra="    StrictHostKeyChecking yes\n")
    r = check(site, cfg=strict)
    assert r.code == ExitStatus.AUTH_REFUSED and "not known" in r.stderr and not kh.exists()
    new = site.ssh_config("shkc-new", known_hosts=str(kh), extra="    StrictHostKeyChecking accept-new\n")
    r = check(site, cfg=new)
    assert r.code == ExitStatus.OK, r.stderr
    assert site.sshd.host_pub.split()[1] in kh.read_text()
    other = keygen(site.root / "shkc-other")
    kh.write_text(f"[127.0.0.1]:{site.sshd.port} {' '.join(other.split()[:2])}\n")
    loose = site.ssh_config("shkc-no", known_hosts=str(kh), extra="    StrictHostKeyChecking no\n")
    r = check(site, cfg=loose)
    assert r.code == ExitStatus.AUTH_REFUSED and "CHANGED" in r.stderr


def test_verbose_says_what_was_tried(site):
    """issue 24, item 6: -v lists on stderr every command run on the host with its exit status and bytes, and
    where the log, the readings and the config came from; stdout stays the report."""
    r = check(site, "-v", "--format", "json")
    assert r.code == ExitStatus.OK, r.stderr
    assert r.json()["formula"]["logged_tokens"] == 159277
    lines = r.stderr.splitlines()
    assert re.match(r"kvaudit: gpu-test: \d+ command\(s\) run, [\d,]+ bytes received", lines[0]), lines[0]
    assert any(l.lstrip().startswith("journalctl ") and "(rc 0," in l for l in lines), lines
    assert any("nvidia-smi --query-gpu=" in l for l in lines)
    assert any(l.strip().startswith("log: journal unit=sglang.service") for l in lines), lines


def test_a_server_that_refuses_sessions_is_said_in_kvaudits_words(site, tmp_path):
    """issue 24, item 6: an sshd with MaxSessions 0 authenticates and then refuses every session channel;
    paramiko says "ChannelException(1, 'Administratively prohibited')", kvaudit says what that means."""
    from tests import hostsim

    pub = site.key.with_name(site.key.name + ".pub").read_text()  # the site's client key, already authorised
    d = hostsim.start_sshd(tmp_path / "sshd", pub, [site.host.bin], extra=("MaxSessions 0",))
    try:
        cfg = site.ssh_config("nosessions", port=d.port)
        (site.root / "nosessions.known_hosts").write_text(f"[127.0.0.1]:{d.port} {d.host_pub}\n")
        r = check(site, cfg=cfg, timeout=60)
    finally:
        d.stop()
    assert r.code == ExitStatus.UNREACHABLE, r.stderr
    assert "refused to open a session channel" in r.stderr and "ChannelException" not in r.stderr, r.stderr
