"""What start-up loads (issue 23, item 2): the version without the CLI, a log with its own engine's formula
only. Asserted as modules loaded, never as time (the bench measures the time: `make bench`)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import SAMPLES

PROBE = """
import io, json, sys
argv = sys.argv[1:]
sys.argv = ["kvaudit", *argv]
from kvaudit.main import main
out = io.StringIO()
real, sys.stdout = sys.stdout, out
try:
    main()
except SystemExit:
    pass
sys.stdout = real
print(json.dumps({"out": out.getvalue()[:200], "modules": sorted(m for m in sys.modules
                  if m.split(".")[0] in ("kvaudit", "typer", "pydantic", "rich"))}))
"""


def _loaded(*argv: str) -> tuple[str, set[str]]:
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return doc["out"], set(doc["modules"])


def test_version_loads_neither_the_cli_nor_the_engines():
    out, mods = _loaded("--version")
    assert out.startswith("kvaudit ")
    assert not {"typer", "pydantic", "kvaudit.cli", "kvaudit.engines"} & mods


def test_a_log_loads_only_its_own_engines_formula():
    out, mods = _loaded("explain", str(SAMPLES / "sglang_029.log"), "--format", "json")
    assert out.lstrip().startswith(("{", "[")), out  # the report was written (its content is tested elsewhere)
    assert "kvaudit.reconcile.sglang.audit" in mods
    assert not {m for m in mods if m.startswith(("kvaudit.reconcile.vllm", "kvaudit.reconcile.trtllm",
                                                  "kvaudit.reconcile.lmdeploy"))}
