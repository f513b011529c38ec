"""ux-audit2 item 20: plan's KV budget and its "KV tokens ... per rank" figure are one quantity printed alike
(a calibrated plan from a real fleet history of the bundled capture), and whatif --help at 80 columns keeps every
word of the engines' fraction options' help."""

from __future__ import annotations

import io
import re

from kvaudit.cli import Environment, run
from tests.conftest import FIXTURES

HOST = FIXTURES / "hosts" / "kimi-k25-tp8"


def _run(*args: str, columns: str = "80") -> str:
    out = io.StringIO()
    run(list(map(str, args)), Environment(stdin=io.BytesIO(), stdout=out, stderr=io.StringIO(), stdout_isatty=False,
                                          stderr_isatty=False, environ={"NO_COLOR": "1", "COLUMNS": columns}))
    return out.getvalue()


def test_plan_prints_the_kv_budget_once_rounded(tmp_path):
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{HOST}\n")
    history = tmp_path / "h.sqlite"
    _run("fleet", inv, "--no-config", "--history", history)
    differs = 0
    for milli in range(800, 960, 3):  # fractions whose budgets end in every third and fourth decimal
        text = _run("plan", HOST / "config.json", "--engine", "sglang==0.5.9", "--gpu", "rtx-pro-6000", "--tp",
                    "8", "--fraction", f"{milli / 1000:.3f}", "--history", history, columns="200")
        budget = re.search(r"KV budget \(rest = post - reserve\)\s+([-\d. to]+) GiB", text)
        per_rank = re.search(r"KV tokens: [\d,-]+ \(([-\d. to]+) GiB per rank", text)
        assert budget and per_rank, text
        differs += budget.group(1) != per_rank.group(1)
    assert differs == 0


def test_whatif_help_at_80_columns_keeps_the_engines_words():
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("kvaudit")
    env = {k: v for k, v in os.environ.items() if k not in ("KVAUDIT_DEBUG", "LINES")} | {"COLUMNS": "80",
                                                                                       "NO_COLOR": "1"}
    p = subprocess.run([str(exe), "whatif", "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and all(len(x) <= 80 for x in p.stdout.splitlines()), p.stdout
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", p.stdout).split())
    assert "TensorRT-LLM: the kv_cache_config fraction to try (0.01-0.99)." in text, text
    assert "LMDeploy: the cache_max_entry_count (a fraction of the free memory)" in text, text
