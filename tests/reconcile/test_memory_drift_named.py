"""MEMORY_DRIFT counts only the engine's own drift (ux-audit2 items 3 and 16): memory a named process holds on the
GPU (FOREIGN_PROCESS, ORPHANED_ENGINE_PROCESS, IDLE_TENANT_MEMORY) is that finding's, not drift again; an
acknowledged tenant leaves no drift warning behind; memory freed since startup says freed. Captures are the bundled
Kimi-K2.5 host (fixtures/hosts/kimi-k25-tp8: GPU 3 had 6.97 GiB free at the end of startup, 6.45 GiB now) with its
nvidia-smi readings changed the way a tenant or a freed cache changes them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import FIXTURES, cli

KIMI = FIXTURES / "hosts" / "kimi-k25-tp8"
GPU3 = "GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c000003"


def _host(tmp: Path, gpu3_free_mib: int, tenant_mib: int | None) -> Path:
    """The Kimi capture with GPU 3's free memory set to ``gpu3_free_mib`` and, when given, a foreign ``python3``
    (pid 77001) holding ``tenant_mib`` there."""
    d = tmp / "host"
    shutil.copytree(KIMI, d)
    rows = []
    for line in (d / "nvidia-smi-gpus.csv").read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        if f[1] == GPU3:
            total, reserved = int(f[4]), int(f[5])
            f[7], f[6] = str(gpu3_free_mib), str(total - reserved - gpu3_free_mib)
        rows.append(", ".join(f))
    (d / "nvidia-smi-gpus.csv").write_text("\n".join(rows) + "\n")
    if tenant_mib is not None:
        with (d / "nvidia-smi-apps.csv").open("a") as fh:
            fh.write(f"77001, {GPU3}, python3, {tenant_mib}\n")
    return d


def _findings(d: Path, *extra: str) -> dict[str, dict]:
    r = cli("check", d, "--format", "json", "--no-config", *extra)
    return {f["code"]: f for f in json.loads(r.stdout)["findings"]}


def test_tenant_memory_is_not_drift_again(tmp_path):
    # the tenant's 6 GiB is all of the loss but the engine's own 0.52 GiB (under the 1 GiB threshold): one finding
    d = _host(tmp_path, 461, 6144)
    found = _findings(d)
    assert found["FOREIGN_PROCESS"]["fields"]["gib"] == 6.0
    assert "MEMORY_DRIFT" not in found
    # acknowledged, the tenant leaves no warning behind it, and the health check is ok
    assert "MEMORY_DRIFT" not in _findings(d, "--ignore", "FOREIGN_PROCESS")
    r = cli("check", d, "--health-check", "--ignore", "FOREIGN_PROCESS", "--no-config")
    assert r.code == 0 and r.stdout.startswith("KVAUDIT OK"), r.stdout


def test_engine_drift_beside_a_tenant_is_the_rest(tmp_path):
    # 3 GiB more gone than the tenant holds: the engine's own 3.52 GiB is drift, the tenant's 6 GiB is said apart,
    # and with 6.45 GiB free but for the tenant, little is not left by the engine: info, not a warning
    d = _host(tmp_path, 461 - 3072, 6144)
    f = _findings(d)["MEMORY_DRIFT"]
    assert f["severity"] == "info"
    assert f["fields"]["engine_drift_gib"] == 3.52 and f["fields"]["named_processes_gib"] == 6.0
    assert f["fields"]["drift_gib"] == 9.52
    assert "+3.52 GiB taken since" in f["message"] and "6.00 GiB more is held by the processes named apart" \
        in f["message"]


def test_engine_drift_alone_warns_when_little_is_left(tmp_path):
    d = _host(tmp_path, 461, None)  # no tenant: the 6.52 GiB are the engine's
    f = _findings(d)["MEMORY_DRIFT"]
    assert f["severity"] == "warning" and f["fields"]["engine_drift_gib"] == 6.52
    assert "+6.52 GiB taken since" in f["message"] and "little is left" in f["message"]


def test_freed_memory_says_freed(tmp_path):
    d = _host(tmp_path, 6605 + 3072, None)  # 3 GiB more free now than at the end of startup
    f = _findings(d)["MEMORY_DRIFT"]
    assert f["severity"] == "info" and f["fields"]["drift_gib"] == -2.48
    assert "2.48 GiB freed since" in f["message"] and "taken" not in f["message"], f["message"]


def test_a_log_of_another_start_judges_no_drift(tmp_path):
    """sglang_c037 (a GB10 start: T 111.58 GiB) beside the RTX PRO 6000 readings (CUDA total 95.56 GiB): no start
    on that GPU measured that T, so memory before T (-16.02 GiB) is no reading and its drift (+44.91 GiB
    'taken') is not judged (ux-audit2 item 17)."""
    d = _host(tmp_path, 6564, None)
    (d / "config.json").unlink()
    log = FIXTURES / "corpus" / "sglang_c037.log"
    (d / "log.txt").write_text("".join(f"{i}:{line}\n" for i, line in enumerate(
        log.read_text(encoding="utf-8", errors="replace").splitlines(), 1)))
    found = _findings(d)
    f = found["READINGS_OF_ANOTHER_START"]
    assert f["severity"] == "info" and f["fields"]["before_t_gib"] == -16.018 and f["fields"]["t_gib"] == 111.58
    assert "MEMORY_DRIFT" not in found and "OCCUPIED_AT_STARTUP" not in found
    # the bundled start on its own readings has none
    assert "READINGS_OF_ANOTHER_START" not in _findings(_host(tmp_path / "own", 6605, None))


def test_a_tenant_there_since_startup_does_not_hide_the_engines_drift(tmp_path):
    """The tenant held its 6 GiB when the engine measured T (GPU 3's memory before T is 6 GiB above the other
    GPUs': a card 6 GiB larger with the tenant on it gives the log's T), and the engine's allocator took 3 GiB
    since: that 3 GiB is drift, the tenant's memory is in before T, not taken since."""
    d = _host(tmp_path, 6605 - 3072, 6144)
    rows = []
    for line in (d / "nvidia-smi-gpus.csv").read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        if f[1] == GPU3:
            f[4] = str(int(f[4]) + 6144)
            f[6] = str(int(f[4]) - int(f[5]) - int(f[7]))
        rows.append(", ".join(f))
    (d / "nvidia-smi-gpus.csv").write_text("\n".join(rows) + "\n")
    found = _findings(d)
    assert "OCCUPIED_AT_STARTUP" in found and "FOREIGN_PROCESS" in found
    f = found["MEMORY_DRIFT"]
    assert f["fields"]["drift_gib"] == 3.52 and f["fields"]["engine_drift_gib"] == 3.52, f
    assert f["fields"]["named_processes_gib"] == 0.0
