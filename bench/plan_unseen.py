"""kvaudit plan on families it has never seen (issue 36): each case is planned from its card, its checkpoint's bytes
and its settings alone (no history), and the plan's KV budget interval (GiB) is held against the KV memory the
engine logged; a startup that failed from memory must be planned `no` or `at risk`.

Two sets, kept apart:
- bench/plan_cases.json: the calibration set. Its startups set the modelled terms' constants (docs/plan.md says
  which); its error is a fit, not a measure.
- bench/plan_validation.json: the validation set. No range or constant was set on it; its error is the measure.

Run: .venv/bin/python bench/plan_unseen.py [--cases FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvaudit.errors import KvauditError  # noqa: E402
from kvaudit.plan.build import PlanRequest, run  # noqa: E402

CALIBRATION = ROOT / "bench" / "plan_cases.json"
VALIDATION = ROOT / "bench" / "plan_validation.json"


def model_dir(root: Path, name: str, ckpt: dict) -> Path:
    d = root / name.replace("/", "--")
    d.mkdir(exist_ok=True)
    config = ROOT / "bench" / "plan_configs" / ckpt["config"]
    if not config.is_file():
        config = ROOT / "fixtures" / "configs" / ckpt["config"]
    (d / "config.json").write_text(config.read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": ckpt["bytes"]},
                                                                 "weight_map": {}}))
    return d


def plan_case(c: dict, d: Path) -> dict[str, Any]:
    """One case planned: its KV budget interval and the plan's word on starting."""
    gpu = c.get("gpu")
    req = PlanRequest(engine=c["engine"], model=str(d), gpu=gpu if isinstance(gpu, str) else None,
                      gpu_memory_gib=c.get("gpu_memory_gib"), tp=c.get("tp", 1), pp=c.get("pp", 1),
                      fraction=c.get("fraction"), context_length=c.get("max_model_len"),
                      page_size=c.get("block_size"), max_running_requests=c.get("max_num_seqs"),
                      max_num_batched_tokens=c.get("max_num_batched_tokens"), kv_dtype=c.get("kv_dtype", "auto"),
                      sampler=c.get("sampler"), max_total_tokens=c.get("max_total_tokens"),
                      post_capture_kv_sizing=c.get("post_capture", False))
    try:
        p = run(req)
    except KvauditError as exc:
        return {"id": c["id"], "refused": str(exc)}
    rest = next((t for t in p.terms if t.key == "rest_gib"), None)
    if rest is None:  # a layout the engine refuses (a TP the heads cannot split): no budget is sized
        return {"id": c["id"], "starts": p.starts, "why": p.starts_reason}
    return {"id": c["id"], "lo": rest.lo, "hi": rest.hi, "starts": p.starts, "why": p.starts_reason}


def p95(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(0.95 * len(s)) - 1))]


def measure(path: Path, show: bool = True) -> dict[str, Any]:
    data = json.loads(path.read_text())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in data["cases"]:
            d = model_dir(Path(tmp), c["model"], data["checkpoints"][c["model"]])
            r = plan_case(c, d)
            r["logged"] = c.get("logged_kv_gib")
            r["failed"] = c.get("outcome", "started") != "started"
            r["configuration"] = c.get("failure") == "configuration"  # refused by the engine before any memory
            r["not_caught"] = c.get("not_caught")
            r["caught"] = c.get("caught")  # called by a threshold chosen after this case pointed at it: not blind
            r["engine"] = c["engine"].split("==")[0]
            rows.append(r)
    sized = [r for r in rows if "lo" in r and r["logged"] is not None and r["logged"] > 0]
    for r in sized:
        r["error"] = ((r["lo"] + r["hi"]) / 2 - r["logged"]) / r["logged"]
        r["held"] = r["lo"] - 0.005 <= r["logged"] <= r["hi"] + 0.005  # the log's two decimals
        r["width"] = (r["hi"] - r["lo"]) / r["logged"]
    failed = [r for r in rows if r["failed"]]
    started = [r for r in rows if not r["failed"]]
    memory = [r for r in failed if not r["configuration"]]
    errs = [abs(r["error"]) for r in sized]
    summary: dict[str, Any] = {
        "file": path.name, "startups": len(rows), "with_kv_budget": len(sized),
        "engines": sorted({r["engine"] for r in rows}),
        "refused": [f"{r['id']}: {r['refused']}" for r in rows if "refused" in r],
        "failed": len(failed), "failed_from_memory": len(memory),
        "failed_planned_no_or_at_risk": sum(r.get("starts") in ("no", "at risk") for r in failed),
        "failed_from_memory_planned_no_or_at_risk": sum(r.get("starts") in ("no", "at risk") for r in memory),
        "not_caught": [f"{r['id']}: {r['not_caught']}" for r in failed if r["not_caught"]],
        "caught_after_seen": [r["id"] for r in rows if r["caught"]],
        "distinct_configurations": len({json.dumps({k: v for k, v in c.items() if k not in ("id", "max_model_len",
                                                                                          "logged", "source")},
                                                   sort_keys=True) for c in data["cases"]}),
        "started_planned_no": sum(r.get("starts") == "no" for r in started),
        "started_planned_at_risk": sum(r.get("starts") == "at risk" for r in started),
    }
    if errs:
        summary.update({"mean_abs_error": round(statistics.fmean(errs), 4),
                        "median_abs_error": round(statistics.median(errs), 4), "p95_abs_error": round(p95(errs), 4),
                        "interval_held": round(sum(r["held"] for r in sized) / len(sized), 3),
                        "median_width": round(statistics.median(r["width"] for r in sized), 4)})
    if show:
        print(f"{path.name}:")
        print(f"  {'case':<34} {'logged':>7} {'plan KV GiB':>15} {'error':>7} held  starts")
        for r in rows:
            if "refused" in r:
                print(f"  {r['id']:<34} refused: {r['refused'][:90]}")
                continue
            logged = "-" if r["logged"] is None else f"{r['logged']:.2f}"
            err = f"{r['error']:+.1%}" if "error" in r else "-"
            held = ("yes" if r["held"] else "no") if "held" in r else "-"
            tag = " (failed)" if r["failed"] else ""
            budget = f"{r['lo']:>7.2f}-{r['hi']:<7.2f}" if "lo" in r else f"{'not sized':>15}"
            print(f"  {r['id']:<34} {logged:>7} {budget} {err:>7} {held:>4}  {r['starts']}{tag}")
        if errs:
            print(f"  {len(sized)} budgets: KV GiB mean abs error {summary['mean_abs_error']:.1%}, median "
                  f"{summary['median_abs_error']:.1%}, p95 {summary['p95_abs_error']:.1%}; interval held "
                  f"{summary['interval_held']:.0%}, median width {summary['median_width']:.1%}")
        print(f"  {len(rows)} startups ({summary['distinct_configurations']} configurations), engines "
              f"{', '.join(summary['engines'])}")
        print(f"  failed: {len(failed)} ({len(memory)} from memory), planned no/at risk: "
              f"{summary['failed_planned_no_or_at_risk']} ({summary['failed_from_memory_planned_no_or_at_risk']} of "
              f"those from memory); started but planned no: {summary['started_planned_no']}, at risk: "
              f"{summary['started_planned_at_risk']}")
        for line in summary["not_caught"]:
            print(f"  not caught: {line[:150]}")
        if summary["caught_after_seen"]:
            print(f"  called by a threshold chosen after they pointed at it (a fit, not a measure): "
                  f"{', '.join(summary['caught_after_seen'])}")
    return summary


def main(show: bool = True) -> dict[str, Any]:
    out = {"calibration": measure(CALIBRATION, show)}
    if VALIDATION.is_file():
        out["validation"] = measure(VALIDATION, show)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=Path)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    result = measure(a.cases, not a.json) if a.cases else main(not a.json)
    if a.json:
        print(json.dumps(result, indent=1))
