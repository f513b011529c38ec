"""A failure quoted from a journal or syslog file (``journalctl -o short-iso``: every line, a traceback's too,
carries ``TIME HOST python3[PID]: ``) quotes the engine's words, never the prefix the journal added."""

from __future__ import annotations

from tests.conftest import FIXTURES, cli

PREFIX = "2026-02-25T10:12:01+0000 gpu-node-07 python3[48190]: "


def test_an_oom_quoted_from_a_syslog_prefixed_log_leaves_the_prefix_out(tmp_path):
    lines = (FIXTURES / "corpus" / "sglang_c009.log").read_text(encoding="utf-8").splitlines()
    log = tmp_path / "syslog.log"
    log.write_text("".join(PREFIX + ln + "\n" for ln in lines))
    head = cli("explain", log, "-f", "json").json()["headline"]
    bare = cli("explain", FIXTURES / "corpus" / "sglang_c009.log", "-f", "json").json()["headline"]
    assert "gpu-node-07" not in head and "OutOfMemoryError" in head
    assert head.split(" (line")[0] == bare.split(" (line")[0]
