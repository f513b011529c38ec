"""Platforms whose GPU memory is not a card's own: told from the lines a log or a host gives.

On a unified-memory device (NVIDIA GB10 in DGX Spark, the Jetson family) the CPU and the GPU share one pool of
system memory, and ``cudaMemGetInfo`` (what SGLang's ``avail mem`` and vLLM's free memory read) reports the system
memory the process may still take, which the OS, the page cache and every other program move. The engines' formulas
run unchanged on it, but T is then system memory, not a card's capacity, and "raise the fraction" takes memory from
the host itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Platform:
    name: str
    unified_memory: bool


#: what names the platform in a log line or a GPU reading, and the platform it names
_MARKERS: tuple[tuple[re.Pattern[str], Platform], ...] = (
    # nvidia-smi's and torch's device name, fused-MoE config file names (device_name=NVIDIA_GB10), the sm_121 arch
    # in FlashInfer/Triton cache paths
    (re.compile(r"\bNVIDIA[ _]GB10\b|\bGB10\b|[/_\b]sm_?121\b"), Platform("DGX Spark (NVIDIA GB10)", True)),
    # SGLang's srt/utils/common.py get_nvgpu_memory_capacity when nvidia-smi reports no memory total (GB10 prints
    # "[N/A]"): the torch.cuda.mem_get_info fallback, i.e. the shared system memory
    (re.compile(r"Failed to get GPU memory capacity from nvidia-smi\. Falling back to torch\.cuda\.mem_get_info"),
     Platform("unified memory (nvidia-smi reports no GPU memory capacity)", True)),
    (re.compile(r"\bJetson\b|\bNVIDIA[ _](?:Jetson[ _])?(?:AGX[ _])?(?:Orin|Thor)\b"),
     Platform("NVIDIA Jetson", True)),
)

#: bytes that select the lines carrying a marker (the scan's anchors: parse.lines keeps only anchored lines)
ANCHORS: tuple[bytes, ...] = (b"GB10", b"sm121", b"sm_121", b"Jetson", b"Falling back to torch.cuda.mem_get_info")


def detect(texts: Iterable[str]) -> Platform | None:
    for text in texts:
        for rx, platform in _MARKERS:
            if rx.search(text):
                return platform
    return None
