"""NVML through nvidia-ml-py, behind a shim (nvitop's pattern): memory info v2 (reserved reported apart)
when the driver has it, v1 otherwise; everything normalised to the same readings nvidia-smi gives (MiB)."""

from __future__ import annotations

import math

from typing import Any

from kvaudit.collect.interface import ComputeApp, GpuReading

MIB = 1 << 20


class NvmlUnavailable(Exception):
    pass


def _s(v: Any) -> str:
    """A driver's string as data: decoded whatever its bytes, no control or invisible characters, bounded."""
    from kvaudit.textsafe import printable

    return printable(v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))[:200]


def read(nvml: Any = None) -> tuple[list[GpuReading], list[ComputeApp], str]:
    """Returns (gpus, apps, memory-info version used). ``nvml`` is the pynvml module (a double in tests)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef,import-untyped,unused-ignore]
        except ImportError:
            raise NvmlUnavailable("nvidia-ml-py is not installed") from None
    try:
        nvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML could not start: {exc}") from None
    gpus: list[GpuReading] = []
    apps: list[ComputeApp] = []
    version = "v2"
    try:
        driver = _s(nvml.nvmlSystemGetDriverVersion())
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _s(nvml.nvmlDeviceGetUUID(h))
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
                reserved = mem.reserved / MIB
            except Exception:  # NVMLError_FunctionNotFound on drivers before 510: v1 has no 'reserved'
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                reserved, version = None, "v1"
            bus = _s(nvml.nvmlDeviceGetPciInfo(h).busId)
            for value in (mem.total, mem.used, mem.free, mem.reserved if reserved is not None else 0):
                if not isinstance(value, int) and not (isinstance(value, float) and math.isfinite(value)):
                    raise NvmlUnavailable(f"NVML returned {value!r} for GPU {i}'s memory, which is not a reading")
            gpus.append(GpuReading(i, uuid, _s(nvml.nvmlDeviceGetName(h)), bus, mem.total / MIB, reserved,
                                   mem.used / MIB, mem.free / MIB, driver))
            for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
                used = p.usedGpuMemory / MIB if p.usedGpuMemory is not None else None
                try:
                    name = _s(nvml.nvmlSystemGetProcessName(p.pid))
                except Exception:
                    name = ""
                apps.append(ComputeApp(p.pid, uuid, name, used))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return gpus, apps, version
