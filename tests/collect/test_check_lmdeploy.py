"""kvaudit check on an LMDeploy host: a real sshd on 127.0.0.1, a TurboMind server's log in real journal files
(unit lmdeploy.service, found by its name), nvidia-smi replaying one card's readings; and a fleet that holds it."""

from __future__ import annotations

import json

import pytest

from kvaudit.collect.commands import is_allowed
from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import needs_journal, needs_sshd
from tests.conftest import FIXTURES, cli_process

pytestmark = [needs_sshd, needs_journal]

LOG = FIXTURES / "corpus" / "lmdeploy_c003.log"  # 1,740 blocks x 64 tokens; session_len cut to the pool
GPU = "0, GPU-2080-0000, NVIDIA GeForce RTX 2080, 00000000:01:00.0, 8192, 7600, 592, 2200, 580.95.05\n"
APPS = "4242, GPU-2080-0000, /usr/bin/python3, 7400\n"


@pytest.fixture(scope="module")
def lm_site(tmp_path_factory):
    with hostsim.ssh_site(tmp_path_factory.mktemp("lmdeploy"), "lm-test", LOG.read_bytes(), GPU, APPS,
                          "lmdeploy.service") as site:
        yield site


def test_lmdeploy_host_over_ssh(lm_site):
    host, cfg = lm_site
    before = host.snapshot()
    r = cli_process("check", "lm-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                    "--format", "json", timeout=60)
    # the log names no model path, so there is no config.json to read: partial, said so
    # partial (no config.json), and a warning (SESSION_EXCEEDS_POOL): the warning decides the one status and exit
    assert r.code == ExitStatus.WARNINGS and r.json()["status"] == "warning", r.stderr + r.stdout
    d = r.json()
    assert any("config.json" in p for p in d["host"]["partial"])
    assert d["engine"] == "lmdeploy" and d["host"]["unit"] == "lmdeploy.service"
    assert d["formula"]["logged_tokens"] == 111360
    assert "SESSION_EXCEEDS_POOL" in {f["code"] for f in d["findings"]}
    assert d["gpus"][0]["free_gib"] == pytest.approx(2200 / 1024, abs=0.01)
    for c in d["host"]["commands"]:
        assert is_allowed(c["command"]), c["command"]
    assert host.snapshot() == before


def test_a_fleet_with_an_lmdeploy_host_reports_it(lm_site, tmp_path):
    host, cfg = lm_site
    out = tmp_path / "fleet.json"
    r = cli_process("fleet", "--hosts", "lm-test", "--ssh-config", cfg, "--journal-directory", str(host.journal),
                    "-f", "json", "-o", out, "-q", timeout=120)
    assert r.code == ExitStatus.WARNINGS, r.stderr  # SESSION_EXCEEDS_POOL over the partial data: the one status
    doc = json.loads(out.read_text())
    hosts = doc["hosts"]
    assert len(hosts) == 1 and hosts[0]["engine"] == "lmdeploy"
    assert hosts[0]["formula"]["logged_tokens"] == 111360
