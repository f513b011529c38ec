"""kvaudit check local: the journal through systemd-python (and through journalctl without it), GPUs
through nvidia-smi when NVML cannot start (no GPU here)."""

from __future__ import annotations

import os

import pytest

from kvaudit.collect.local import LocalRunner, journal_python
from kvaudit.collect.session import CollectOptions, HostSession
from kvaudit.engines import all_anchors
from kvaudit.status import ExitStatus
from tests.collect.conftest import needs_journal

pytestmark = needs_journal


def test_systemd_python_and_journalctl_select_the_same_lines(site):
    pytest.importorskip("systemd.journal")
    via_python = list(journal_python("sglang.service", None, str(site.host.journal), all_anchors()))
    session = HostSession(LocalRunner(), "local", CollectOptions(all_anchors(), unit="sglang.service",
                                                                 journal_directory=str(site.host.journal)))
    via_journalctl = session.log_lines()  # latest invocation only
    latest = [t for _, t in via_journalctl]
    assert [t for _, t in via_python][-len(latest):] == latest
    assert len(via_python) > len(latest)  # python read every start of the unit; the parser picks the latest


@pytest.mark.parametrize("with_python", [True, False])
def test_check_local(site, with_python):
    if with_python:
        pytest.importorskip("systemd.journal")  # the [journal] extra may not build; the Makefile says so
    env = dict(os.environ, PATH=f"{site.host.bin}:{os.environ['PATH']}")
    args = ["check", "local", "--journal-directory", str(site.host.journal), "--unit", "sglang.service",
            "--format", "json"]
    import subprocess
    import sys

    code = ("import sys; sys.modules['systemd'] = None; sys.argv = ['kvaudit'] + sys.argv[1:]; "
            "from kvaudit.cli import main; main()") if not with_python else None
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "kvaudit"]
    p = subprocess.run(cmd + args, capture_output=True, env=env, timeout=60)
    assert p.returncode == ExitStatus.OK, p.stderr.decode()
    import json

    d = json.loads(p.stdout)
    assert d["formula"]["logged_tokens"] == 159277 and len(d["gpus"]) == 8
    assert ("systemd-python" in d["host"]["source"]) == with_python
