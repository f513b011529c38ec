"""kvaudit plan on families it has never seen (issue 25's second goal): each case of bench/plan_cases.json is planned
from its card, its checkpoint's bytes and its settings alone (no history), and the plan's KV GiB interval is held
against the KV memory the engine logged. Prints each case and the mean absolute error of the interval's middle.

Run: .venv/bin/python bench/plan_unseen.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvaudit.plan.build import PlanRequest, run  # noqa: E402


def model_dir(root: Path, name: str, ckpt: dict) -> Path:
    d = root / name.replace("/", "--")
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text((ROOT / "fixtures" / "configs" / ckpt["config"]).read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": ckpt["bytes"]},
                                                                 "weight_map": {}}))
    return d


def main() -> dict:
    data = json.loads((ROOT / "bench" / "plan_cases.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in data["cases"]:
            d = model_dir(Path(tmp), c["model"], data["checkpoints"][c["model"]])
            p = run(PlanRequest(engine=c["engine"], model=str(d), gpu=c["gpu"], tp=c["tp"], fraction=c["fraction"],
                                context_length=c["max_model_len"], page_size=c["block_size"]))
            # the budget the engine computed is the plan's rest term (its pool is that, less block rounding)
            rest = next(t for t in p.terms if t.key == "rest_gib")
            mid = (rest.lo + rest.hi) / 2
            err = (mid - c["logged_kv_gib"]) / c["logged_kv_gib"]
            held = rest.lo <= c["logged_kv_gib"] <= rest.hi
            rows.append((c["id"], c["logged_kv_gib"], rest.lo, rest.hi, err, held))
    print(f"{'case':<28} {'logged':>8} {'plan (GiB)':>17} {'error':>8}  held")
    for cid, logged, lo, hi, err, held in rows:
        print(f"{cid:<28} {logged:>8.2f} {lo:>8.2f}-{hi:<8.2f} {err:>+8.1%}  {'yes' if held else 'no'}")
    errs = [abs(r[4]) for r in rows]
    summary = {"configurations": len(rows), "mean_abs_error": round(statistics.fmean(errs), 4),
               "median_abs_error": round(statistics.median(errs), 4),
               "interval_held": round(sum(r[5] for r in rows) / len(rows), 3)}
    print(f"\n{len(rows)} configurations, family not seen: KV GiB mean absolute error {summary['mean_abs_error']:.1%}, "
          f"median {summary['median_abs_error']:.1%}; interval held {sum(r[5] for r in rows)}/{len(rows)}")
    return summary


if __name__ == "__main__":
    main()
