"""The health check in the contracts of the systems that run it (issue 37, item 1): Node Problem Detector's
custom-plugin config and its 80-byte message, Nagios' first line and perfdata, NHC's check function run by real
bash, and a Slurm HealthCheckProgram, each driving the real CLI on the bundled capture (and on a copy of it with
another process holding memory on GPU 3)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.health import Health, Problem, STATUS_TEXT_BYTES, perfdata, render, status_text
from tests.conftest import FIXTURES, ROOT

CONTRIB = ROOT / "contrib"
CAPTURE = FIXTURES / "hosts" / "kimi-k25-tp8"
KVAUDIT = Path(sys.executable).with_name("kvaudit")
BASH = shutil.which("bash")

#: Go's time.ParseDuration grammar, as NPD parses invoke_interval and timeout (pkg/custompluginmonitor/types/
#: config.go, ApplyConfiguration)
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
#: NPD's config keys (CustomPluginConfig, pluginGlobalConfig, CustomRule, types.Condition json tags)
NPD_TOP = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
NPD_PLUGIN_CONFIG = {"invoke_interval", "timeout", "max_output_length", "concurrency",
                     "enable_message_change_based_condition_update", "skip_initial_status"}
NPD_RULE = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
NPD_CONDITION = {"type", "reason", "message", "status", "transition"}
#: one Nagios perfdata item (Monitoring Plugins Development Guidelines, "Performance data"):
#: 'label'=value[UOM];[warn];[crit];[min];[max]
RANGE = r"@?(~|-?\d+(\.\d+)?)?:?(-?\d+(\.\d+)?)?"
PERFDATA_ITEM = re.compile(rf"^([^'= ]+|'[^']+')=-?\d+(\.\d+)?(us|ms|s|%|B|KB|MB|TB|c)?"
                           rf"(;({RANGE})?){{0,2}}(;(-?\d+(\.\d+)?)?){{0,2}}$")
FOREIGN_LINE = "KVAUDIT CRITICAL - GPU 3: 6.0 GiB held by pid 77001 (not the engine)"


def go_seconds(s: str) -> float:
    assert GO_DURATION.match(s), s
    return sum(float(n) * GO_UNITS[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ns|us|µs|ms|s|m|h)", s))


@pytest.fixture(scope="module")
def shared_gpu(tmp_path_factory) -> Path:
    """The capture with a training job's 6 GiB on GPU 3 (nvidia-smi's compute-apps row for pid 77001)."""
    d = tmp_path_factory.mktemp("cap") / "gpu-shared"
    shutil.copytree(CAPTURE, d)
    uuid = next(line.split(",")[1].strip() for line in (d / "nvidia-smi-gpus.csv").read_text().splitlines()
                if line.startswith("3,"))
    with (d / "nvidia-smi-apps.csv").open("a") as fh:
        fh.write(f"77001, {uuid}, python3 train.py, 6144\n")
    return d


def run_kvaudit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(KVAUDIT), *args], capture_output=True, text=True, timeout=timeout)


def npd_message(stdout: str, max_output_length: int) -> str:
    """What NPD keeps of a plugin's stdout (pkg/custompluginmonitor/plugin/plugin.go, Plugin.run): trimmed,
    then cut at max_output_length bytes."""
    b = stdout.strip().encode()
    return b[:max_output_length].decode("utf-8", "replace")


# --- Node Problem Detector ----------------------------------------------------------------------------------


def npd_config() -> dict:
    return json.loads((CONTRIB / "npd" / "kvaudit-plugin-monitor.json").read_text())


def test_the_npd_config_follows_npds_custom_plugin_schema():
    cfg = npd_config()
    assert set(cfg) <= NPD_TOP and cfg["plugin"] == "custom" and cfg["source"]
    pc = cfg["pluginConfig"]
    assert set(pc) <= NPD_PLUGIN_CONFIG
    assert pc["max_output_length"] == STATUS_TEXT_BYTES and pc["concurrency"] >= 1
    assert go_seconds(pc["invoke_interval"]) > 0
    global_timeout = go_seconds(pc["timeout"])
    assert global_timeout <= 5.0  # NPD's example and default timeout
    conditions = {c["type"] for c in cfg["conditions"]}
    for c in cfg["conditions"]:
        assert set(c) <= NPD_CONDITION and c["type"] and c["reason"] and c["message"]
    assert {r["type"] for r in cfg["rules"]} == {"temporary", "permanent"}
    for r in cfg["rules"]:
        assert set(r) <= NPD_RULE and r["reason"] and r["path"]
        assert all(isinstance(a, str) for a in r["args"])
        # Validate(): a rule's timeout may not exceed the global one; a permanent rule needs a default condition
        assert go_seconds(r["timeout"]) <= global_timeout
        if r["type"] == "permanent":
            assert r["condition"] in conditions
        # the rule runs the health check on NPD's exit-code scale, within the timeout
        args = r["args"]
        assert args[:2] == ["check", "local"] and "--health-check" in args
        assert args[args.index("--exit-codes") + 1] == "npd"
        assert float(args[args.index("--timeout") + 1]) < go_seconds(r["timeout"])
        assert Path(r["path"]).name == "kvaudit"


@pytest.mark.parametrize("shared", [False, True])
def test_npd_runs_the_rule_and_keeps_the_whole_verdict(shared, shared_gpu):
    """The rule's own arguments, on the capture: exit 0 (ok) or 1 (a node problem), and NPD's message (trimmed
    stdout cut at max_output_length) is the whole verdict, not the start of a JSON document."""
    cfg = npd_config()
    rule = next(r for r in cfg["rules"] if r["type"] == "permanent")
    args = list(rule["args"])
    args[1] = str(shared_gpu if shared else CAPTURE)
    p = run_kvaudit(*args)
    assert p.returncode == (1 if shared else 0), p.stderr
    message = npd_message(p.stdout, cfg["pluginConfig"]["max_output_length"])
    assert message == p.stdout.strip() and "\n" not in message
    if shared:
        assert message == FOREIGN_LINE
    else:
        assert message.startswith("KVAUDIT OK - 159,277 tokens")


def test_npd_unknown_when_the_check_cannot_run(tmp_path):
    p = run_kvaudit("check", str(tmp_path / "nowhere"), "--health-check", "--exit-codes", "npd")
    assert p.returncode == 2 and p.stdout.startswith("KVAUDIT UNKNOWN - not run: ") and "error" in p.stderr
    assert "\n" not in p.stdout.strip() and len(p.stdout.strip().encode()) <= 80


# --- Nagios -------------------------------------------------------------------------------------------------


def nagios_parts(stdout: str) -> tuple[str, list[str], list[str]]:
    first, *long_output = stdout.rstrip("\n").split("\n")
    text, bar, perf = first.partition(" | ")
    assert bar, first
    return text, perf.split(" "), long_output


def test_nagios_first_line_and_perfdata_on_a_healthy_host():
    p = run_kvaudit("check", str(CAPTURE), "--health-check")
    assert p.returncode == 0, p.stderr
    text, perf, long_output = nagios_parts(p.stdout)
    assert len(text.encode()) <= 80 and text.startswith("KVAUDIT OK - 159,277 tokens")
    assert long_output == []
    for item in perf:
        assert PERFDATA_ITEM.match(item), item
    values = dict(i.split("=", 1) for i in perf)
    assert values["node_problems"].startswith("0;") and values["kv_tokens"].startswith("159277;")
    assert float(values["time"].split("s;")[0]) < 5.0


def test_nagios_critical_names_the_gpu_the_pid_and_the_amount(shared_gpu):
    p = run_kvaudit("check", str(shared_gpu), "--health-check", "--exit-codes", "nagios")
    assert p.returncode == 2, p.stderr
    text, perf, long_output = nagios_parts(p.stdout)
    assert text == FOREIGN_LINE
    assert all(PERFDATA_ITEM.match(i) for i in perf)
    assert "node_problems=1;;0;0;" in perf
    assert long_output and long_output[0].startswith("FOREIGN_PROCESS (node): GPU 3") and "pid 77001" in long_output[0]
    # a config problem as well: still critical (the node problem decides), counted in the perfdata
    p = run_kvaudit("check", str(shared_gpu), "--health-check", "--mem-fraction-static", "0.5")
    text, perf, _ = nagios_parts(p.stdout)
    assert p.returncode == 2 and text == FOREIGN_LINE + " (+1 more)" and "config_problems=1;0;;0;" in perf
    # a config problem alone warns
    p = run_kvaudit("check", str(CAPTURE), "--health-check", "--mem-fraction-static", "0.5")
    text, _, _ = nagios_parts(p.stdout)
    assert p.returncode == 1 and text.startswith("KVAUDIT WARNING - TOKENS_MISMATCH: ") and len(text.encode()) <= 80


def test_json_only_on_request(shared_gpu):
    p = run_kvaudit("check", str(shared_gpu), "--health-check", "--format", "json")
    d = json.loads(p.stdout)
    assert p.returncode == 2 and d["schema"] == "kvaudit.health/1" and d["state"] == "critical"
    assert d["problems"][0]["code"] == "FOREIGN_PROCESS"
    p = run_kvaudit("check", str(shared_gpu), "--health-check", "--format", "markdown")
    assert p.returncode == 3 and p.stdout.startswith("KVAUDIT UNKNOWN - not run: ")


def _health(problems: tuple[Problem, ...], headline: str = "OK fine", state: str = "warning") -> Health:
    return Health("gpu-1", "sglang", "0.5.9", state, headline, problems, 0, None)


@pytest.mark.parametrize("message", [
    "x" * 300,
    "é" * 200,  # two bytes each: the cut never splits a character
    "the pool | is off; " * 20,  # '|' would start Nagios' perfdata
    "a\x1b[31m red \x07 bell\r\nnext line " * 10,  # control characters and line breaks from a hostile host
])
def test_the_status_text_is_one_line_of_at_most_80_bytes(message):
    h = _health((Problem("TOKENS_MISMATCH", "warning", "config", message, "do"),
                 Problem("UNUSED_MEMORY", "warning", "config", "idle", "do")))
    text = status_text(h)
    raw = text.encode()
    assert len(raw) <= STATUS_TEXT_BYTES and raw.decode() == text
    assert "|" not in text and "\n" not in text and "\x1b" not in text and "\x07" not in text
    assert text.startswith("KVAUDIT WARNING - TOKENS_MISMATCH: ") and text.endswith(" (+1 more)")
    assert render(h, "npd") == text + "\n"
    first = render(h, "nagios").split("\n")[0]
    assert first.split(" | ")[0] == text and all(PERFDATA_ITEM.match(i) for i in first.split(" | ")[1].split())


def test_a_long_ok_headline_keeps_whole_clauses():
    h = _health((), "OK 159,277 tokens = formula; 11.18 GiB free is the reserve; 6.93 GiB free for activations",
                "ok")
    assert status_text(h) == "KVAUDIT OK - 159,277 tokens = formula; 11.18 GiB free is the reserve"
    u = _health((), "UNCHECKED 12 tokens; the pool size could not be checked: no formula for this release", "ok")
    assert status_text(u).startswith("KVAUDIT OK - unchecked: 12 tokens")


def test_perfdata_thresholds_say_what_decides_the_state():
    h = _health((Problem("FOREIGN_PROCESS", "warning", "node", "m", "a"),), state="critical")
    items = perfdata(h, 0.25).split()
    assert items[0] == "node_problems=1;;0;0;" and items[1] == "config_problems=0;0;;0;"
    assert items[-1] == "time=0.250s;;5;0;"


# --- NHC ----------------------------------------------------------------------------------------------------

NHC_SCRIPT = CONTRIB / "nhc" / "kvaudit.nhc"


def nhc(*check_args: str) -> tuple[int, str]:
    """check_kvaudit sourced into real bash, with NHC's die() and log() stubbed to print what NHC would do."""
    script = (f"source {NHC_SCRIPT}\n"
              "die() { echo \"DIE[$1] ${*:2}\"; }\n"
              "log() { echo \"LOG ${*}\"; }\n"
              "check_kvaudit \"$@\"\necho \"RETURN $?\"\n")
    p = subprocess.run([BASH, "-c", script, "nhc", *check_args], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.rsplit("RETURN ", 1)[1]), p.stdout


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_nhc_passes_a_healthy_node():
    rc, out = nhc("-k", str(KVAUDIT), "-T", str(CAPTURE))
    assert rc == 0 and "DIE" not in out and "LOG" not in out


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_nhc_dies_on_a_node_problem(shared_gpu):
    rc, out = nhc("-k", str(KVAUDIT), "-T", str(shared_gpu), "-t", "8")
    assert rc == 1
    assert "DIE[1] check_kvaudit:  CRITICAL - GPU 3: 6.0 GiB held by pid 77001 (not the engine)\n" in out


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_nhc_logs_a_config_problem_and_an_unknown_verdict_without_offlining():
    rc, out = nhc("-k", str(KVAUDIT), "-T", str(CAPTURE), "--", "--mem-fraction-static", "0.5")
    assert rc == 0 and "DIE" not in out and "LOG check_kvaudit:  WARNING - TOKENS_MISMATCH" in out
    rc, out = nhc("-k", "/nonexistent/kvaudit")
    assert rc == 0 and "DIE" not in out and "exited 127 without a verdict" in out
    rc, out = nhc("-u", "-k", "/nonexistent/kvaudit")
    assert rc == 1 and "DIE[1] check_kvaudit:  UNKNOWN" in out
    rc, out = nhc("-x")
    assert rc == 1 and "DIE[1] check_kvaudit:  Invalid option:  -x" in out


# --- Slurm --------------------------------------------------------------------------------------------------


@pytest.fixture
def scontrol(tmp_path) -> Path:
    """A stand-in for Slurm's scontrol (not part of kvaudit): records its arguments; `show node` answers with
    the reason in KVAUDIT_FAKE_REASON."""
    log = tmp_path / "scontrol.log"
    exe = tmp_path / "scontrol"
    exe.write_text("#!/bin/bash\n"
                   f"printf '%s\\n' \"$*\" >> {log}\n"
                   "if [[ $1 == show ]]; then echo \"NodeName=$3 State=DRAIN Reason=$KVAUDIT_FAKE_REASON\"; fi\n")
    exe.chmod(0o755)
    return exe


def slurm(scontrol: Path, target: Path, reason: str = "", *args: str) -> list[str]:
    env = dict(os.environ, KVAUDIT=str(KVAUDIT), KVAUDIT_TARGET=str(target), KVAUDIT_NODE="gpu-07",
               SCONTROL=str(scontrol), KVAUDIT_FAKE_REASON=reason)
    p = subprocess.run([str(CONTRIB / "slurm" / "kvaudit-healthcheck"), *args], capture_output=True, text=True,
                       timeout=90, env=env)
    assert p.returncode == 0, p.stderr
    log = scontrol.with_name("scontrol.log")
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_slurm_drains_on_a_node_problem_and_resumes_only_its_own_drain(scontrol, shared_gpu):
    calls = slurm(scontrol, shared_gpu)
    assert calls == ["update NodeName=gpu-07 State=DRAIN "
                     "Reason=kvaudit: CRITICAL - GPU 3: 6.0 GiB held by pid 77001 (not the engine)"]
    scontrol.with_name("scontrol.log").unlink()
    calls = slurm(scontrol, CAPTURE, "kvaudit: CRITICAL - GPU 3 [root@2026-12-02T04:00:00]")
    assert calls == ["show node gpu-07 -o", "update NodeName=gpu-07 State=RESUME"]
    scontrol.with_name("scontrol.log").unlink()
    calls = slurm(scontrol, CAPTURE, "NHC: check_fs_mount failed [root@2026-12-02T04:00:00]")
    assert calls == ["show node gpu-07 -o"]  # someone else's drain stays
    scontrol.with_name("scontrol.log").unlink()
    assert slurm(scontrol, CAPTURE, "", "--mem-fraction-static", "0.5") == []  # a config problem: no drain
