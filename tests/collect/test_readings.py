"""nvidia-smi CSV, the NVML shim (with a double: no GPU here), captures, and the live reconciliation."""

from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from kvaudit.collect import capture, nvml
from kvaudit.collect.interface import ComputeApp, GpuReading
from kvaudit.collect.nvidia_smi import SmiParseError, parse_apps, parse_gpus
from tests.collect.conftest import CAPTURE

H200 = ("0, GPU-abc, NVIDIA H200, 00000000:18:00.0, 143771, 614, 32362, 110796, 590.48.01\n"
        "1, GPU-def, NVIDIA H200, 00000000:2A:00.0, [N/A], [N/A], [Requested functionality has been deprecated], 0, 590.48.01\n")


def test_parse_gpus_with_special_values():
    g = parse_gpus(H200)
    assert g[0] == GpuReading(0, "GPU-abc", "NVIDIA H200", "00000000:18:00.0", 143771, 614, 32362, 110796, "590.48.01")
    assert g[1].total_mib is None and g[1].used_mib is None and g[1].free_mib == 0


def test_parse_gpus_rejects_garbage():
    with pytest.raises(SmiParseError):
        parse_gpus("not, csv\n")


def test_parse_apps():
    apps = parse_apps("4711, GPU-abc, sglang::scheduler_TP0, 28234\n4712, GPU-abc, python3, [N/A]\n"
                      "No running processes found\n")
    assert apps == [ComputeApp(4711, "GPU-abc", "sglang::scheduler_TP0", 28234), ComputeApp(4712, "GPU-abc", "python3", None)]


class FakeNvml:
    """An NVML double: the pynvml calls kvaudit makes, over recorded H200 numbers (bytes)."""

    nvmlMemory_v2 = 0x02000028

    def __init__(self, v2: bool = True):
        self.v2 = v2
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"590.48.01"

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return "GPU-abc"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:18:00.0")

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        mib = 1 << 20
        if version:
            if not self.v2:
                raise RuntimeError("NVMLError_FunctionNotFound")
            return SimpleNamespace(total=143771 * mib, reserved=614 * mib, used=32362 * mib, free=110796 * mib)
        return SimpleNamespace(total=143771 * mib, used=32976 * mib, free=110796 * mib)  # v1: used includes reserved

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=4711, usedGpuMemory=28234 * (1 << 20)), SimpleNamespace(pid=4712, usedGpuMemory=None)]

    def nvmlSystemGetProcessName(self, pid):
        return b"sglang::scheduler_TP0" if pid == 4711 else b"python3"


def test_nvml_v2_reports_reserved_apart():
    fake = FakeNvml()
    gpus, apps, version = nvml.read(fake)
    assert version == "v2" and fake.shut
    assert gpus[0].reserved_mib == 614 and gpus[0].used_mib == 32362
    assert apps == [ComputeApp(4711, "GPU-abc", "sglang::scheduler_TP0", 28234), ComputeApp(4712, "GPU-abc", "python3", None)]


def test_nvml_falls_back_to_v1():
    gpus, _, version = nvml.read(FakeNvml(v2=False))
    assert version == "v1" and gpus[0].reserved_mib is None and gpus[0].used_mib == 32976


def test_nvml_missing_is_reported_not_raised():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    with pytest.raises(nvml.NvmlUnavailable, match="could not start"):
        nvml.read(Broken())


def test_capture_round_trip(tmp_path):
    c = capture.read(str(CAPTURE))
    out = capture.write(c, str(tmp_path / "again"))
    again = capture.read(str(out))
    assert again.log_lines == c.log_lines and again.gpus == c.gpus and again.apps == c.apps
    assert again.config_json == c.config_json and again.commands == c.commands


def test_a_directory_that_is_not_a_capture(tmp_path):
    from kvaudit.collect.interface import CollectError

    (tmp_path / "capture.json").write_text('{"format": "something else"}')
    with pytest.raises(CollectError, match="not a kvaudit-capture"):
        capture.read(str(tmp_path))


# --- live reconciliation -----------------------------------------------------------------------------------


def _kimi():
    from kvaudit.check import CheckOptions, audit_collected, _parse
    from kvaudit.reconcile.interface import AuditOptions

    c = capture.read(str(CAPTURE))
    return c, (lambda coll: audit_collected(coll, _parse(coll), CheckOptions(AuditOptions())))


def test_kimi_capture_maps_ranks_by_process_title():
    c, run = _kimi()
    h = run(c)
    assert [(g.index, g.rank, g.mapped_by) for g in h.gpus] == [(i, f"TP{i}", "process name") for i in range(8)]
    assert h.findings == ()
    g0 = h.gpus[0]
    assert g0.cuda_total_gib == pytest.approx((97887 - 32) / 1024, abs=0.001)
    assert g0.before_t_gib == pytest.approx(95.56 - 94.01, abs=0.01)
    assert g0.drift_gib == pytest.approx(0.52, abs=0.01) and g0.nvml_identity is True


def test_foreign_process_and_occupied_at_startup():
    c, run = _kimi()
    apps = c.apps + (ComputeApp(9999, c.gpus[3].uuid, "python3 train.py", 4096),)
    h = run(replace(c, apps=apps))
    codes = {f.code: f for f in h.findings}
    assert codes["FOREIGN_PROCESS"].fields["gpu"] == 3 and codes["FOREIGN_PROCESS"].fields["gib"] == 4.0
    # the same GPU, but the process was there at startup: T on it is 4 GiB lower
    gpus = tuple(replace(g, total_mib=g.total_mib + 4096) if g.index == 3 else g for g in c.gpus)
    h = run(replace(c, apps=apps, gpus=gpus))
    assert "OCCUPIED_AT_STARTUP" in {f.code for f in h.findings}


def test_index_order_mapping_and_count_mismatch():
    c, run = _kimi()
    anon = tuple(replace(a, name="python3") for a in c.apps)
    h = run(replace(c, apps=anon))
    assert all(g.mapped_by == "index order" for g in h.gpus)
    h = run(replace(c, apps=anon, gpus=c.gpus[:4]))
    assert "GPU_COUNT_MISMATCH" in {f.code for f in h.findings}


def test_memory_drift_under_load():
    c, run = _kimi()
    gpus = tuple(replace(g, free_mib=512, used_mib=g.used_mib + g.free_mib - 512) for g in c.gpus)
    h = run(replace(c, gpus=gpus))
    drift = next(f for f in h.findings if f.code == "MEMORY_DRIFT")
    assert drift.severity.value == "warning"  # only 0.5 GiB left


def test_demo_capture_exit_code_is_clean():
    from tests.conftest import cli

    r = cli("check", CAPTURE)
    assert r.code == 0 and "GPUs now" in r.stdout and "RESERVE_EXPLAINS_FREE" in r.stdout


def test_live_thresholds_are_settable():
    from tests.conftest import cli

    plain = cli("check", CAPTURE, "-f", "json").json()
    assert "MEMORY_DRIFT" not in {f["code"] for f in plain["findings"]}  # 0.52 GiB < 1 GiB
    strict = cli("check", CAPTURE, "-f", "json", "--threshold", "drift_gib=0.25").json()
    drift = next(f for f in strict["findings"] if f["code"] == "MEMORY_DRIFT")
    assert drift["fields"]["drift_gib"] == pytest.approx(0.52, abs=0.01)


# --- non-finite readings are not readings (issue #10) ---------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "9" * 400])
def test_nvidia_smi_non_finite_is_a_parse_error(value):
    with pytest.raises(SmiParseError, match="not a reading"):
        parse_gpus(f"0, GPU-abc, NVIDIA H200, 00000000:18:00.0, 143771, 614, {value}, 110796, 590.48.01\n")
    with pytest.raises(SmiParseError):
        parse_apps(f"4711, GPU-abc, sglang::scheduler_TP0, {value}\n")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nvml_non_finite_is_unavailable(bad):
    fake = FakeNvml()
    real = fake.nvmlDeviceGetMemoryInfo
    fake.nvmlDeviceGetMemoryInfo = lambda h, version=None: SimpleNamespace(**{**vars(real(h, version)), "used": bad})
    with pytest.raises(nvml.NvmlUnavailable, match="not a reading"):
        nvml.read(fake)
    assert fake.shut


# --- capture directories are untrusted input (issue #10) -------------------------------------------------------


def _copy_capture(tmp_path):
    import shutil

    d = tmp_path / "cap"
    shutil.copytree(CAPTURE, d)
    return d


def _bad(d, message):
    from tests.conftest import cli_process

    r = cli_process("check", d)
    assert r.code == 2 and r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, \
        (r.code, r.stderr)


@pytest.mark.parametrize("edit,message", [
    (lambda d: (d / "capture.json").write_text("[1, 2]"), "not a kvaudit-capture"),
    (lambda d: (d / "capture.json").write_text('{"format": "kvaudit-capture", "commands": [{"x": 1}]}'),
     "unexpected shape"),
    (lambda d: (d / "capture.json").write_text('{"format": "kvaudit-capture", "server_pids": "1"}'),
     "unexpected shape"),
    (lambda d: (d / "capture.json").write_text('{"format": "kvaudit-capture", "processes": [{"pid": 1}]}'),
     "unexpected shape"),
    (lambda d: (d / "capture.json").write_text(
        '{"format": "kvaudit-capture", "processes": [{"pid": -4, "ppid": 1, "state": "S", "title": "x", '
        '"rss_mib": null, "swap_mib": null}]}'), "unexpected shape"),
    (lambda d: (d / "capture.json").write_text('{"format": "kvaudit-capture", "meminfo_mib": [["MemTotal", 1e300]]}'),
     "unexpected shape"),
    (lambda d: (d / "capture.json").write_text('{"format": "kvaudit-capture", "host": NaN}'), "not readable JSON"),
    (lambda d: (d / "capture.json").write_bytes(b'{"format": "kvaudit-capture", "host": "\xff\xfe"}'),
     "not readable JSON"),
    (lambda d: ((d / "log.txt").unlink(), (d / "log.txt").mkdir()), "not a regular file"),
    (lambda d: ((d / "config.json").unlink(), (d / "config.json").symlink_to("/etc/passwd")), "regular files only"),
    (lambda d: ((d / "nvidia-smi-gpus.csv").unlink(), os.mkfifo(d / "nvidia-smi-gpus.csv")), "not a regular file"),
    (lambda d: (d / "log.txt").write_bytes(b"1:" + b"x" * (81 << 20)), "over the"),
])
def test_a_malformed_capture_is_bad_input(tmp_path, edit, message):
    d = _copy_capture(tmp_path)
    edit(d)
    _bad(d, message)


def test_capture_writes_only_into_a_capture_directory(tmp_path):
    h = capture.read(str(CAPTURE))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(capture.CaptureError, match="not a kvaudit capture"):
        capture.write(h, str(other))
    assert (other / "notes.txt").read_text() == "mine"
    link = tmp_path / "link"
    link.symlink_to(other)
    with pytest.raises(capture.CaptureError, match="symlink"):
        capture.write(h, str(link))


def test_capture_over_an_earlier_one_removes_its_stale_files_and_follows_no_symlink(tmp_path):
    d = _copy_capture(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    (d / "log.txt").unlink()
    (d / "log.txt").symlink_to(victim)  # a planted link must not redirect the write
    c = replace(capture.read(str(CAPTURE)), gpus=(), apps=(), config_json=None)
    capture.write(c, str(d))
    assert victim.read_text() == "untouched" and not (d / "log.txt").is_symlink()
    assert not (d / "nvidia-smi-gpus.csv").exists() and not (d / "config.json").exists()  # stale files gone
    assert capture.read(str(d)).log_lines == c.log_lines
