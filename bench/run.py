"""kvaudit benchmarks (`make bench`). Prints ratios, never asserts: speed is measured, not tested.

1. explain on a generated 1 GiB journal vs `grep -E` with the same line anchors on the same file
   (target: within 2x), and peak memory at 64 MiB vs 1 GiB (target: flat).
2. the pure-Python fallback scanner (no grep on the machine) on 64 MiB, for reference.
3. CLI start-up: `kvaudit --version` and `explain` of a 15 KB log vs a bare `python -c pass` (targets: 100 ms
   and 150 ms on a current machine), and the imports that cost most (`python -X importtime`).
4. The fleet JSON report for 100 and 500 hosts, the whole document against the streamed one (bench/fleet_json.py).
5. kvaudit plan's accuracy: leave-one-out over the corpus, and on families it has never seen
   (bench/plan_unseen.py over bench/plan_cases.json).
6. Start-up side by side (bench/startup.py: --version, --help, explain of a small log, check of a capture and of an
   SSH target, against `python -c pass`) and kvaudit's CPU per added host in a loopback fleet (bench/host_cpu.py);
   both take BENCH_BEFORE_TREE=DIR, an earlier checkout, to print its figures next to these.

Each figure is the best of N runs (the least disturbed by other load). Results go to bench/out/results.json;
bench/baseline.json holds an earlier run, printed side by side. `python bench/run.py --save-baseline`
replaces the baseline.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from genlog import generate  # noqa: E402

from kvaudit.engines import all_anchors  # noqa: E402

KVAUDIT = str(Path(sys.executable).with_name("kvaudit"))
RUNS = int(os.environ.get("BENCH_RUNS", "3"))


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one run of cmd. Output goes to a file, not /dev/null: GNU grep
    notices /dev/null and stops at the first match."""
    with (OUT / "stdout.tmp").open("wb") as sink:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.PIPE, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1):
        err = p.stderr.read().decode() if p.stderr else ""
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {err}")
    return wall, usage.ru_maxrss


def best(cmd: list[str], env: dict | None = None, runs: int = RUNS) -> dict:
    results = [measure(cmd, env) for _ in range(runs)]
    return {"seconds": round(min(r[0] for r in results), 4), "peak_rss_kib": max(r[1] for r in results)}


#: a real 15 KB startup (SGLang), for the start-up of `explain`
SMALL_LOG = ROOT / "fixtures" / "samples" / "sglang_029.log"


def print_import_costs(top: int = 8) -> None:
    """The modules whose import costs most in `explain` of the small log (self time, `-X importtime`)."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvaudit", "explain", str(SMALL_LOG)],
                       capture_output=True, text=True)
    rows = []
    for line in p.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            rows.append((int(parts[0]), int(parts[1]), parts[2].strip()))
    total = sum(r[0] for r in rows)
    print(f"\nexplain of {SMALL_LOG.name}: imports {total / 1000:.0f} ms in all; the costliest (self, ms):")
    for self_us, _, name in sorted(rows, reverse=True)[:top]:
        print(f"  {self_us / 1000:7.1f}  {name}")


def main() -> None:
    OUT.mkdir(exist_ok=True)
    import startup

    # the timed rows run as an operator's install does: a plain interpreter, without the development venv's editable
    # finder hook in every start (bench/startup.py, plain_python); `-m kvaudit` finds this tree from ROOT
    plain = startup.plain_python()
    kv = [plain, "-m", "kvaudit"]
    big = generate(OUT / "log-1g.log", 1 << 30)
    small = generate(OUT / "log-64m.log", 64 << 20)
    from kvaudit.explain import _engine_from_head, scan_anchors
    from kvaudit.parse.lines import with_transport

    with big.open("rb") as fh:  # the anchors kvaudit itself scans this file with (until 2026-12-02 this took the
        engine = _engine_from_head(fh)  # engine's alone: 27 of the 41, and rg alone looked 1.4x faster than it is)
    used = with_transport(scan_anchors(engine))
    pattern = "|".join(re.escape(a.decode()) for a in used)
    pattern_all = "|".join(re.escape(a.decode()) for a in all_anchors())
    cenv = dict(os.environ, LC_ALL="C")
    grep = shutil.which("grep")
    res: dict[str, dict] = {}
    print(f"input: {big} ({big.stat().st_size / 2**30:.2f} GiB), {small.stat().st_size / 2**20:.0f} MiB; "
          f"best of {RUNS}; "
          f"anchors: {engine.name if engine else 'all engines'} ({len(used)})")
    subprocess.run(["cat", str(big)], stdout=subprocess.DEVNULL)  # warm the page cache for both
    res["grep_1g"] = best([grep, "-a", "-c", "-E", pattern, str(big)], cenv)
    res["grep_1g_all_engines_anchors"] = best([grep, "-a", "-c", "-E", pattern_all, str(big)], cenv)
    res["explain_1g"] = best([*kv, "explain", str(big), "--format", "json"])
    res["explain_1g_with_grep"] = best([*kv, "explain", str(big), "--format", "json"],
                                       dict(os.environ, KVAUDIT_SCANNER="grep"))
    from kvaudit.parse.lines import _ripgrep

    rg = _ripgrep()
    if rg:  # ripgrep alone, with the same anchors, as kvaudit runs it
        rg_args = [a for x in used for a in ("-e", x.decode())]
        res["rg_1g"] = best([rg, "--no-config", "--encoding", "none", "-a", "-c", "-F", *rg_args, str(big)], cenv)
    if rg:  # a pipe (issue 23, item 3): kvaudit against cat | rg -n with the same anchors (rg numbers lines too)
        quoted = " ".join(shlex.quote(a) for a in rg_args)
        res["explain_pipe_1g"] = best(["sh", "-c", f"cat {shlex.quote(str(big))} | {shlex.join(kv)} explain - "
                                                   "--format json"])
        res["cat_rg_pipe_1g"] = best(["sh", "-c", f"cat {shlex.quote(str(big))} | {shlex.quote(rg)} --no-config "
                                                  f"--encoding none -a -n -F {quoted}"], cenv)
    res["explain_64m"] = best([*kv, "explain", str(small), "--format", "json"])
    res["explain_64m_python_scanner"] = best([*kv, "explain", str(small), "--format", "json"],
                                              dict(os.environ, KVAUDIT_NO_GREP="1"), runs=1)
    res["grep_64m"] = best([grep, "-a", "-c", "-E", pattern, str(small)], cenv)
    res["cli_version"] = best([*kv, "--version"], runs=5)
    res["explain_small_log"] = best([*kv, "explain", str(SMALL_LOG)], runs=5)
    res["python_bare"] = best([plain, "-c", "pass"], runs=5)

    ratios = {
        "explain_vs_grep_1g": res["explain_1g"]["seconds"] / res["grep_1g"]["seconds"],
        "peak_rss_1g_vs_64m": res["explain_1g"]["peak_rss_kib"] / res["explain_64m"]["peak_rss_kib"],
        "python_scanner_vs_grep_64m": res["explain_64m_python_scanner"]["seconds"] / res["grep_64m"]["seconds"],
        "cli_startup_vs_bare_python": res["cli_version"]["seconds"] / res["python_bare"]["seconds"],
        "explain_small_vs_bare_python": res["explain_small_log"]["seconds"] / res["python_bare"]["seconds"],
    }
    if "rg_1g" in res:
        ratios["explain_vs_rg_1g"] = res["explain_1g"]["seconds"] / res["rg_1g"]["seconds"]
    if "cat_rg_pipe_1g" in res:
        ratios["explain_pipe_vs_cat_rg_1g"] = res["explain_pipe_1g"]["seconds"] / res["cat_rg_pipe_1g"]["seconds"]
    targets = {"explain_vs_grep_1g": 2.0, "peak_rss_1g_vs_64m": 1.2, "explain_vs_rg_1g": 1.0,
               "explain_pipe_vs_cat_rg_1g": 1.2}
    baseline_path = HERE / "baseline.json"
    base_doc = json.loads(baseline_path.read_text()) if baseline_path.exists() else {}
    baseline = base_doc.get("ratios", {})
    base_res = base_doc.get("results", {})

    print(f"\n{'measurement':34} {'seconds':>9} {'baseline':>9} {'now/base':>9} {'peak RSS MiB':>13}")
    for k, v in res.items():
        b = base_res.get(k, {}).get("seconds")
        bs = "-" if b is None else f"{b:.3f}"
        rs = "-" if not b else f"{v['seconds'] / b:.2f}"
        print(f"{k:34} {v['seconds']:9.3f} {bs:>9} {rs:>9} {v['peak_rss_kib'] / 1024:13.1f}")
    print(f"\n{'ratio':34} {'now':>8} {'baseline':>9} {'target':>8}")
    for k, v in ratios.items():
        b = baseline.get(k)
        t = targets.get(k)
        bs = "-" if b is None else f"{b:.2f}"
        ts = "" if t is None else f"< {t:g}"
        print(f"{k:34} {v:8.2f} {bs:>9} {ts:>8}")
    print_import_costs()
    import fleet_json
    import fleet_scaling
    import health_check
    import host_cpu
    import journal_bytes
    import plan_unseen
    import wan

    starts = startup.main()

    report = fleet_json.main()
    network = journal_bytes.main()
    wan_check = wan.main()
    # issue 25: the plan's accuracy, leave-one-out over the corpus (docs/plan.md, "Measured accuracy")
    v = json.loads(subprocess.run([KVAUDIT, "plan", "--validate", str(ROOT / "fixtures" / "corpus"), "-f", "json"],
                                  capture_output=True, check=True).stdout)
    validation = {k: v[k] for k in ("startups", "t_given", "family_seen", "family_not_seen", "not_predictable")}
    print(f"\nplan --validate fixtures/corpus: {json.dumps(validation)}")
    print("\nplan on families it has not seen (calibration: bench/plan_cases.json; validation: plan_validation.json):")
    unseen = plan_unseen.main()
    fleet = fleet_scaling.main()
    health = health_check.main()  # issue 37: the health check's time against NPD's 5 s
    per_host = host_cpu.main()
    doc = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
           "results": res, "ratios": {k: round(v, 3) for k, v in ratios.items()}, "check_network": network,
           "check_wan": wan_check,
           "plan_validation": validation, "plan_unseen": unseen,
           "fleet_json": report,
           "fleet": fleet, "health_check": health, "startup": starts, "host_cpu": per_host}
    (OUT / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    if "--save-baseline" in sys.argv:
        baseline_path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nbaseline saved to {baseline_path}")


if __name__ == "__main__":
    main()
