"""Hostile inputs 3 (issue 39) on real parts: a forged log line over a real sshd and journal must not copy a file
into a capture, and a pods/exec frame announcing a gigabyte is not read by the websocket client's close()."""

from __future__ import annotations

import json
import subprocess
import sys

from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import KIMI_CONFIG, KIMI_LOG, cli_process
from tests.kubesim import FakePod, api_server, kubeconfig, pod_log

SECRET = "Ym9iOmdocF9TRUNSRVQ="  # a registry's base64 user:token


@needs_sshd
@needs_journal
def test_a_forged_startup_line_does_not_copy_a_credentials_file_into_a_capture(site, tmp_path):
    """A request logged with a raw newline printed `server_args=...(model_path='<dir>/.docker')` with SGLang's
    prefix: kvaudit took it as startup 2 of 2 and `capture` wrote <dir>/.docker/config.json (registry auth) into
    the capture the docs say to attach to a ticket. Only a file that parses as a model config reaches a capture or
    a report."""
    docker = tmp_path / "home" / ".docker"
    docker.mkdir(parents=True)
    (docker / "config.json").write_text(json.dumps({"auths": {"registry.example.com": {"auth": SECRET}}}))
    kimi = KIMI_LOG.read_bytes().replace(b"/models/moonshotai/Kimi-K2.5", str(site.host.model_dir).encode())
    forged = [b"2026-02-25T10:22:00+0000 gpu-node-07 python3[48190]: [2026-02-25 10:22:00] INFO:     10.0.4.17:40122 - "
              b"\"POST /generate HTTP/1.1\" prompt=hello",
              b"[2026-02-25 10:22:00] server_args=ServerArgs(model_path='" + str(docker).encode()
              + b"', tokenizer_path='" + str(docker).encode() + b"', tp_size=8, mem_fraction_static=0.85)"]
    journal = tmp_path / "journal"
    hostsim.write_journal(journal, hostsim.export_entries(kimi.rstrip(b"\n").split(b"\n") + forged,
                                                         "sglang.service", "f" * 32, 48190, 1_771_900_000_000_000))
    cfg = site.trusted_config()
    out = tmp_path / "cap"
    r = cli_process("capture", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(journal),
                    "--unit", "sglang.service", "-o", out, "--no-config", timeout=120)
    assert r.code in (ExitStatus.OK, ExitStatus.PARTIAL_DATA), (r.code, r.stdout, r.stderr)
    held = {p.name: p.read_text(errors="replace") for p in out.iterdir()}
    assert not any(SECRET in text or "auths" in text for text in held.values()), sorted(held)
    # the forged line opens no startup (kvaudit.parse.request_time): the real one's own config.json is captured
    assert "config.json" not in held or "model_type" in json.loads(held["config.json"]), held.get("config.json")
    r = cli_process("check", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(journal),
                    "--unit", "sglang.service", "-f", "json", "--no-config", timeout=120)
    assert SECRET not in r.stdout + r.stderr and "auths" not in r.stdout


def test_a_pod_exec_frame_announcing_a_gigabyte_is_not_read_on_close(tmp_path):
    """The frame announcing 1 GiB was refused, but websocket-client's close() then waited for the server's close
    frame and read the refused frame's payload whole (2.1 GB for 2 GiB; 16 GiB killed at 5 GB past --timeout 30):
    a stream that did not end cleanly is now cut at the socket."""
    pod = FakePod("llm", "kimi-0", [("sglang", "lmsysorg/sglang:v0.5.9-cu129", 30000)],
                  {("sglang", False): pod_log(KIMI_LOG.read_text().splitlines())}, exec_flood="whole")
    with api_server([pod]) as (url, _):
        cfg = kubeconfig(tmp_path / "cfg", url)
        probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
                 "print(r.returncode); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
                 "sys.stdout.write(r.stdout)")
        r = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "kvaudit", "check", "k8s:llm/kimi-0",
                            "--kubeconfig", str(cfg), "-m", str(KIMI_CONFIG), "--timeout", "30", "-f", "json"],
                           capture_output=True, text=True, timeout=180)
    code, peak_kib, out = r.stdout.split("\n", 2)
    assert int(code) == ExitStatus.PARTIAL_DATA, r.stdout + r.stderr
    d = json.loads(out)
    assert d["formula"]["logged_tokens"]
    assert any("over kvaudit's bound" in p for p in d["host"]["partial"]), d["host"]["partial"]
    assert int(peak_kib) < 400 * 1024, peak_kib  # far below the 1 GiB the frame announced and the server sent


@needs_sshd
@needs_journal
def test_a_hung_nvidia_smi_is_a_node_problem_not_a_lost_audit(site):
    """issue 39, item 5: a hung nvidia-smi lost the whole audit (exit 4 after the full host deadline, the log already
    read) and the health check said unknown; the node's driver is what is wrong, so it is a node problem."""
    import time

    site.host.set_smi_mode("hang")
    try:
        t = time.monotonic()
        r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                        str(site.host.journal), "--health-check", "--format", "json", "--timeout", "20", timeout=90)
        took = time.monotonic() - t
    finally:
        site.host.set_smi_mode("ok")
    d = r.json()
    assert r.code == 2 and d["state"] == "critical", (r.code, r.stdout, r.stderr)  # Nagios CRITICAL
    (p,) = [p for p in d["problems"] if p["code"] == "GPU_READINGS_MISSING"]
    assert p["problem"] == "node" and "no answer within" in p["message"]
    assert took < 20 + 15, took


def _kvaudit(*args, env=None, cwd=None, timeout=120):
    import os

    exe = [sys.executable, "-m", "kvaudit"]
    return subprocess.run([*exe, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**{k: v for k, v in os.environ.items() if k != "KVAUDIT_DEBUG"}, **(env or {})})


@needs_sshd
def test_shell_syntax_in_a_host_name_never_reaches_a_proxy_command(site, tmp_path):
    """issue 39, item 6: with KVAUDIT_NO_SSH_G=1 (paramiko's reader), %h in a ProxyCommand still expanded an
    inventory's host name holding shell syntax into a command a shell ran."""
    marker = tmp_path / "pwned"
    cfg = tmp_path / "ssh_config"
    cfg.write_text('Host *\n    ProxyCommand sh -c "true %h"\n    ConnectTimeout 5\n')
    for no_g in ("1", ""):
        r = _kvaudit("check", "gpu;touch pwned", "--ssh-config", cfg, "--no-config", "--timeout", "20",
                     env={"KVAUDIT_NO_SSH_G": no_g}, cwd=tmp_path)
        assert r.returncode == 2 and "shell syntax" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not marker.exists()


@needs_sshd
@needs_journal
def test_hash_known_hosts_yes_records_a_hashed_entry(site, tmp_path):
    """issue 39, item 6: HashKnownHosts yes still wrote a plain known_hosts entry (the host's name in clear)."""
    kh = tmp_path / "known_hosts"
    cfg = site.ssh_config("hashed", known_hosts=str(kh), extra="    StrictHostKeyChecking accept-new\n"
                                                               "    HashKnownHosts yes\n")
    for _ in range(2):  # the second run finds the host by its hashed entry
        r = cli_process("check", "gpu-test", "--ssh-config", cfg, "--journal-directory", str(site.host.journal),
                        "--no-config", timeout=120)
        assert r.code in (ExitStatus.OK, ExitStatus.WARNINGS), (r.code, r.stderr)
    (line,) = kh.read_text().splitlines()
    assert line.startswith("|1|") and "127.0.0.1" not in line


@needs_sshd
@needs_journal
def test_messages_name_the_host_script_never_quote_it(site):
    """issue 39, item 8: a host past its deadline was said 'while running: sh -c 'n=$1 kind=$2 ...'' in the
    health-check headline and the fleet report."""
    site.host.set_smi_mode("hang")
    try:
        r = cli_process("check", "gpu-test", "--ssh-config", site.trusted_config(), "--journal-directory",
                        str(site.host.journal), "--health-check", "--format", "json", "--timeout", "3", timeout=90)
    finally:
        site.host.set_smi_mode("ok")
    d = r.json()
    assert d["state"] == "unknown" and "deadline" in d["headline"], d  # 3 s: less than nvidia-smi's own 3 s bound
    assert "kvaudit's collection script" in d["headline"] and "n=$1" not in r.stdout + r.stderr, d["headline"]


def test_the_host_script_reads_config_json_only_where_a_line_names_a_model(tmp_path):
    """issue 39, item 2: the host script read the config.json of up to four paths any selected line quoted (an
    error message, a prompt); now only paths on lines that name a model (model_path=, 'model':, models--...)."""
    from kvaudit.collect import commands as C
    from kvaudit.collect.local import LocalRunner
    from kvaudit.collect.session import script_parts

    docker, model = tmp_path / ".docker", tmp_path / "models" / "m"
    for d in (docker, model):
        d.mkdir(parents=True)
        (d / "config.json").write_text('{"model_type": "llama"}')
    log = tmp_path / "server.log"
    log.write_text(f"[2026-01-01] KV Cache is allocated. #tokens: 1, K size: 1.00 GB, dir='{docker}'\n"
                   f"[2026-01-01] server_args=ServerArgs(model_path='{model}', K size 1.00 GB)\n")
    cmd = C.host_script("0123456789abcdef", "file", None, None, str(log), None, 1 << 20, ("sglang",), (b"GB",))
    parts = script_parts(LocalRunner().run(cmd, 30, 1 << 20), b"0123456789abcdef")
    read = [p.args[0] for p in parts if p.kind == "config"]
    assert read == [f"{model}/config.json"], read
