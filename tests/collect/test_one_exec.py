"""Issue 23, item 1: ``check`` collects a host in one exec (the host script), on a systemd host and on one
without systemd, and gets the same audit as when every command runs on its own.

The exec requests are counted by the real sshd: its ``ForceCommand`` is a wrapper that notes each request on the
simulated host (the test's own file, not kvaudit's doing) and runs the requested command. A systemd host is the
simulated host plus a ``systemctl`` stand-in answering the three questions kvaudit asks (a container cannot run
systemd as PID 1), and a ``journalctl`` that reads the host's journal files as its system journal (the real
journalctl, pointed at them).
"""

from __future__ import annotations

import os

import pytest

from kvaudit.collect.commands import is_allowed
from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import CAPTURE, needs_journal, needs_sshd
from tests.conftest import KIMI_CONFIG, KIMI_LOG, SAMPLES, cli_process

pytestmark = [needs_sshd, needs_journal]

SYSTEMCTL = """#!/bin/sh
# systemctl stand-in: the engine's unit running, its invocation and control group
case "$*" in
  "list-units --type=service --all --no-legend --plain --no-pager")
    printf 'cron.service loaded active running Regular background program processing daemon\\n'
    printf 'sglang.service loaded active running SGLang server\\n'
    printf 'ssh.service loaded active running OpenBSD Secure Shell server\\n';;
  "show -p InvocationID --value -- sglang.service") echo %s;;
  "show -p ControlGroup --value -- sglang.service") echo /system.slice/sglang.service;;
  *) echo "Unit not found." >&2; exit 1;;
esac
"""
NO_SYSTEMD = """#!/bin/sh
echo "System has not been booted with systemd as init system (PID 1). Can't operate." >&2
echo "Failed to connect to bus: Host is down" >&2
exit 1
"""


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """A host behind a real sshd that counts exec requests; yields (host, ssh_config, requests file)."""
    root = tmp_path_factory.mktemp("one-exec")
    host = hostsim.make_host(root / "host", KIMI_LOG.read_bytes(), (CAPTURE / "nvidia-smi-gpus.csv").read_text(),
                             (CAPTURE / "nvidia-smi-apps.csv").read_text(), KIMI_CONFIG.read_text(),
                             previous_log=(SAMPLES / "sglang_029.log").read_bytes())
    journalctl = host.bin / "journalctl"
    journalctl.write_text(f'#!/bin/sh\ncase "$*" in *--directory*) exec /usr/bin/journalctl "$@";; esac\n'
                          f'exec /usr/bin/journalctl --directory {host.journal} "$@"\n')
    journalctl.chmod(0o755)
    requests = root / "exec-requests"
    wrapper = root / "count-exec"
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "${{SSH_ORIGINAL_COMMAND%% *}}" >> {requests}\n'
                       'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n')
    wrapper.chmod(0o755)
    key = root / "client_key"
    sshd = hostsim.start_sshd(root / "sshd", hostsim.keygen(key), [host.bin], extra=(f"ForceCommand {wrapper}",))
    cfg = root / "ssh_config"
    cfg.write_text(f"Host gpu-one\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {os.environ.get('USER') or 'root'}\n"
                   f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {root}/known_hosts\n")
    (root / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    yield host, cfg, requests
    sshd.stop()


def _check(counted, systemctl: str | None, *args, before: list | None = None):
    host, cfg, requests = counted
    stand_in = host.bin / "systemctl"
    if systemctl is None:
        stand_in.unlink(missing_ok=True)
    else:
        stand_in.write_text(systemctl)
        stand_in.chmod(0o755)
    requests.write_text("")
    if before is not None:
        before.append(host.snapshot())
    r = cli_process("check", "gpu-one", "--ssh-config", cfg, "--format", "json", *args)
    return r, requests.read_text().splitlines()


def _essentials(d):
    return (d["formula"]["logged_tokens"], d["formula"]["predicted_tokens"], d["formula"]["bytes_per_token_source"],
            d["host"]["config_source"], d["host"]["invocation_id"], len(d["gpus"]),
            sorted(x["code"] for x in d["findings"]))


def test_a_systemd_host_is_read_in_one_exec(counted):
    host, before = counted[0], []
    r, execs = _check(counted, SYSTEMCTL % ("b" * 32), before=before)
    assert r.code == ExitStatus.OK, r.stderr
    assert len(execs) == 1, execs
    d = r.json()
    assert d["host"]["unit"] == "sglang.service" and d["host"]["invocation_id"] == "b" * 32
    assert d["host"]["config_source"] == f"{host.model_dir}/config.json"
    assert d["formula"]["bytes_per_token_source"] == "config" and d["formula"]["logged_tokens"] == 159277
    ran = [c["command"] for c in d["host"]["commands"]]
    assert all(is_allowed(c) for c in ran)  # each part is reported as the gated command it is
    assert any(c.startswith("systemctl show -p InvocationID") for c in ran)
    # the invocation's read (through its startup's ready line when its last lines are serving: commands.py)
    assert any("journalctl" in c and "_SYSTEMD_INVOCATION_ID=" + "b" * 32 in c for c in ran)
    assert host.snapshot() == before[0]  # nothing on the host changed


def test_a_host_without_systemd_is_read_in_one_exec(counted):
    """systemctl cannot answer: the unit is found in the journal, its latest invocation there, in the same exec."""
    r, execs = _check(counted, NO_SYSTEMD)
    assert r.code == ExitStatus.OK, r.stderr
    assert len(execs) == 1, execs
    d = r.json()
    assert d["host"]["unit"] == "sglang.service" and d["host"]["invocation_id"] == "b" * 32
    assert d["host"]["config_source"].endswith("/config.json") and d["startup"]["total"] == 1


def test_one_exec_gives_the_audit_the_commands_one_by_one_give(counted):
    """The same audit as the session's own commands give, each run on its own (a host where the script cannot
    run: here its shell refuses it, so every command falls back and runs by itself)."""
    one, execs = _check(counted, SYSTEMCTL % ("b" * 32))
    host, cfg, requests = counted
    wrapper = cfg.parent / "count-exec"
    text = wrapper.read_text()
    # the host's shell refuses the script (a restricted shell would): the session runs its commands one by one
    wrapper.write_text(text.replace('exec /bin/sh', 'case "$SSH_ORIGINAL_COMMAND" in *@@*) echo refused >&2; '
                                    'exit 126;; esac\nexec /bin/sh'))
    try:
        each, many = _check(counted, SYSTEMCTL % ("b" * 32))
    finally:
        wrapper.write_text(text)
    assert one.code == each.code == ExitStatus.OK, each.stderr
    assert len(execs) == 1 and len(many) > 3, many
    assert _essentials(one.json()) == _essentials(each.json())
    assert one.json()["gpus"] == each.json()["gpus"]


def test_a_unit_given_on_a_systemd_host_is_one_exec_too(counted):
    r, execs = _check(counted, SYSTEMCTL % ("b" * 32), "--unit", "sglang.service")
    assert r.code == ExitStatus.OK and len(execs) == 1, (r.stderr, execs)


def test_a_journal_directory_is_one_exec(counted):
    host = counted[0]
    r, execs = _check(counted, None, "--journal-directory", str(host.journal))
    assert r.code == ExitStatus.OK and len(execs) == 1, (r.stderr, execs)
    assert r.json()["host"]["config_source"] == f"{host.model_dir}/config.json"
