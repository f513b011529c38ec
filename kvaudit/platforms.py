"""Platforms whose GPU memory is not a card's own: told from the lines a log or a host gives.

On a unified-memory device (NVIDIA GB10 in DGX Spark, the Jetson family) the CPU and the GPU share one pool of
system memory, and ``cudaMemGetInfo`` (what SGLang's ``avail mem`` and vLLM's free memory read) reports the system
memory the process may still take, which the OS, the page cache and every other program move. The engines' formulas
run unchanged on it, but T is then system memory, not a card's capacity, and "raise the fraction" takes memory from
the host itself.

vLLM's CPU backend has no device memory at all: its KV cache is host memory of a set size, ``VLLM_CPU_KVCACHE_SPACE``
(``platforms/cpu.py``), and gpu_memory_utilization sizes nothing there (``Platform.cpu``).
"""

from __future__ import annotations

from typing import Iterable

from kvaudit.parse.patterns import LazyPattern, lazy
from kvaudit.record import record


@record
class Platform:
    name: str
    unified_memory: bool
    #: no device memory: the engine runs on the host's CPUs and its KV cache is a set amount of host memory
    cpu: bool = False

    @property
    def kind(self) -> str:
        """The support table's platform kind (kvaudit.support.KINDS["platform"])."""
        return "cpu" if self.cpu else "unified" if self.unified_memory else "discrete"

    @property
    def meaning(self) -> str:
        """What the engine's memory readings mean on this platform, for the audit's note (a card of its own has
        none: kvaudit.engines.on_platform names only the other kinds)."""
        if self.cpu:  # vLLM's CPU backend: platforms/cpu.py
            return ("no GPU memory is involved. The engine sizes its KV cache from VLLM_CPU_KVCACHE_SPACE "
                    "(platforms/cpu.py), a set amount of host memory; gpu_memory_utilization sizes nothing here")
        return ("unified memory. The free memory the engine measured (T and every 'avail mem') is the system memory "
                "the process could still take, shared with the OS and other programs, not a card's capacity; it "
                "moves between two readings, so small gaps against the formula are expected")


#: SGLang's own line when nvidia-smi cannot give the card's memory (0.5.x ``get_device_memory_capacity`` in
#: srt/utils: ``nvidia-smi --query-gpu=memory.total`` answers "[N/A]" on unified-memory devices, whose memory is
#: the host's), then the capacity torch reports instead, in MiB
FALLBACK = lazy(r"Failed to get GPU memory capacity from nvidia-smi\. "
                      r"Falling back to torch\.cuda\.mem_get_info\(\)(?:.*?\(MiB\): \[(?P<mib>[\d, ]+)\])?")

#: what names the platform in a log line or a GPU reading, and the platform it names. Each is a sign the engines
#: themselves print; GH200/GB200 are not here: their GPU has HBM of its own, which is what cudaMemGetInfo reports
#: and what a larger fraction would take (the CPU's memory is reached only through explicit oversubscription)
_MARKERS: tuple[tuple[LazyPattern, Platform], ...] = (
    # nvidia-smi's and torch's device name, fused-MoE config file names (device_name=NVIDIA_GB10), the sm_121 arch
    # in FlashInfer/Triton cache paths
    (lazy(r"\bNVIDIA[ _]GB10\b|\bGB10\b|[/_\b]sm_?121\b"), Platform("DGX Spark (NVIDIA GB10)", True)),
    (lazy(r"\bJetson\b|\bNVIDIA[ _](?:Jetson[ _])?(?:AGX[ _])?(?:Orin|Thor)\b"),
     Platform("NVIDIA Jetson", True)),
    # AMD's APU: CPU and GPU share one HBM pool (rocm-smi and torch name it "AMD Instinct MI300A")
    (lazy(r"\bMI300A\b"), Platform("AMD Instinct MI300A (APU)", True)),
    # torch's device property, as engines and their debug lines print it
    (lazy(r"\bis_integrated\W{1,3}(?:True|1)\b|\bcudaDevAttrIntegrated\W{1,3}1\b"),
     Platform("an integrated GPU (unified memory)", True)),
    (FALLBACK, Platform("a device whose memory nvidia-smi cannot report (the engine fell back to torch's reading)",
                        True)),
    # vLLM's CPU backend, in its own words: platforms/__init__.py "Automatically detected platform cpu.", the
    # VLLM_CPU_KVCACHE_SPACE warning (executor/cpu_executor.py 0.6, platforms/cpu.py 0.7-0.14: "(GB|GiB) for CPU
    # backend is not set, using 4 by default", 0.14 "not set. Using X GiB for KV cache"), V0's block line with the
    # platform's device name (executor_base.py 0.7-0.10: "# cpu blocks: N") and cpu_worker.py's errors
    (lazy(r"Automatically detected platform cpu\.|VLLM_CPU_KVCACHE_SPACE(?: \(Gi?B\) for CPU backend is "
          r"not set| not set\. Using)|# cpu blocks: \d|Try increasing `VLLM_CPU_KVCACHE_SPACE`"),
     Platform("vLLM's CPU backend (the KV cache is host memory of a set size)", False, cpu=True)),
)

#: bytes that select the lines carrying a marker (the scan's anchors: parse.lines keeps only anchored lines)
ANCHORS: tuple[bytes, ...] = (b"GB10", b"sm121", b"sm_121", b"Jetson", b"Orin", b"Thor", b"MI300A", b"is_integrated",
                              b"cudaDevAttrIntegrated", b"Falling back to torch.cuda.mem_get_info",
                              b"detected platform cpu", b"VLLM_CPU_KVCACHE_SPACE", b"# cpu blocks")
#: the same words as text: a line holding none of them names no platform (no regex runs on it)
_WORDS: tuple[str, ...] = tuple(a.decode() for a in ANCHORS)


def detect(texts: Iterable[str]) -> Platform | None:
    for text in texts:
        if not any(w in text for w in _WORDS):
            continue
        for rx, platform in _MARKERS:
            if rx.search(text):
                return platform
    return None
