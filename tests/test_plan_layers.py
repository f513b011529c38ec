"""Issue 33's layering, for the plan: no engine's planner imports the plan command package (its vocabulary lives in
kvaudit/planning/, below the engines), and the plan command package imports no other command package (fleet,
explain, report.rows), so the package import graph has no cycle through the plan."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kvaudit"


def imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_no_engine_planner_imports_the_plan_command_package():
    planners = sorted(ROOT.glob("reconcile/*/planner.py"))
    assert len(planners) >= 4
    for p in planners:
        bad = {m for m in imported(p) if m == "kvaudit.plan" or m.startswith("kvaudit.plan.")}
        assert not bad, f"{p.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_planning_vocabulary_imports_no_command_package():
    for p in sorted((ROOT / "planning").glob("*.py")):
        bad = {m for m in imported(p) if m.split(".")[:2] in (["kvaudit", "plan"], ["kvaudit", "fleet"],
                                                               ["kvaudit", "explain"], ["kvaudit", "report"],
                                                               ["kvaudit", "cli"], ["kvaudit", "engines"])}
        assert not bad, f"{p.relative_to(ROOT)} imports {sorted(bad)}"


def test_the_plan_command_package_imports_no_fleet_explain_or_report_rows():
    for p in sorted((ROOT / "plan").glob("*.py")):
        bad = {m for m in imported(p) if m.startswith(("kvaudit.fleet", "kvaudit.explain", "kvaudit.report.rows"))}
        assert not bad, f"{p.relative_to(ROOT)} imports {sorted(bad)}"
