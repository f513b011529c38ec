"""GPU cards by the memory their tool reports for them (nvidia-smi's ``memory.total``, rocm-smi's "VRAM Total Memory"),
so a plan can start from a card name. Each figure was read off real output in a public source (named beside it); a
card not here is given as ``--gpu-memory-gib``. What CUDA (or HIP) can use of it, and what is gone before the engine
measures T (the reserved memory, the CUDA context, NCCL), is the plan's T offset: calibrated from the history, or
assumed.

Unified-memory machines (GB10 / DGX Spark, GH200-class, Jetson): the GPU shares the host's memory, the engines read
its free memory through ``cudaMemGetInfo`` which counts the page cache and other processes, and T is not a card's
total less a driver reserve. kvaudit plan does not model them and says so rather than plan them as a discrete card.
"""

from __future__ import annotations


from kvaudit.errors import KvauditError
from kvaudit.record import record


@record
class Card:
    key: str
    name: str  # as nvidia-smi / rocm-smi name it
    total_mib: int
    source: str = ""  # where the figure was read


CARDS = (
    Card("a100-40g", "NVIDIA A100-SXM4-40GB", 40960, "modal-labs/modal-client#2797 (nvidia-smi totals by GPU type)"),
    Card("a100-80g", "NVIDIA A100-SXM4-80GB", 81920, "NVIDIA/mig-parted#31 (nvidia-smi: 81920MiB)"),
    Card("h100", "NVIDIA H100 80GB HBM3", 81559, "vllm-project/vllm#55169 (nvidia-smi: 81559MiB)"),
    Card("h100-nvl", "NVIDIA H100 NVL", 95330, "fastfetch-cli/fastfetch#1658 (the driver's dedicated total "
                                               "99,961,274,368 B)"),
    Card("h200", "NVIDIA H200", 143771, "kvaudit's fixtures (nvidia-smi)"),
    Card("b200", "NVIDIA B200", 183359, "kvaudit's fixtures (nvidia-smi)"),
    Card("l40s", "NVIDIA L40S", 46068, "modal-labs/modal-client#2797"),
    Card("a40", "NVIDIA A40", 46068, "sgl-project/sglang#1522 (nvidia-smi: 46068MiB)"),
    Card("a10g", "NVIDIA A10G", 23028, "NVIDIA/DCGM#232 (nvidia-smi: 23028MiB)"),
    Card("a10", "NVIDIA A10", 23028, "modal-labs/modal-client#2797; mayooot/detect-gpu#3 (Total 24,146,608,128 B)"),
    Card("l4", "NVIDIA L4", 23034, "modal-labs/modal-client#2797"),
    Card("rtx-4090", "NVIDIA GeForce RTX 4090", 24564, "vllm-project/vllm#7768 (nvidia-smi: 24564MiB)"),
    Card("rtx-5090", "NVIDIA GeForce RTX 5090", 32607, "noonghunna/club-3090#1107 (nvidia-smi: 32607MiB)"),
    Card("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "kvaudit's fixtures (nvidia-smi)"),
    Card("h20", "NVIDIA H20", 97871, "deepseek-ai/DeepGEMM#268 (nvidia-smi: 97871MiB)"),
    Card("h20-3e", "NVIDIA H20-3e", 143771, "ModelCloud/GPTQModel#2220 (nvidia-smi: 143771MiB)"),
    Card("h800", "NVIDIA H800", 81559, "NVIDIA/DCGM#183 (nvidia-smi: 81559MiB)"),
    Card("a800-80g", "NVIDIA A800-SXM4-80GB", 81920, "dexmal/dexbotic#41 (nvidia-smi: 81920MiB)"),
    Card("a800-pcie-80g", "NVIDIA A800 80GB PCIe", 81920, "vllm-project/vllm#41519 (nvidia-smi: 81920MiB)"),
    # GDDR6 workstation cards give ECC its share of the memory: nvidia-smi's total differs by ECC state (its
    # "Volatile Uncorr. ECC" column: "Off", or a count when on). The name finds the ECC-off figure; the -ecc key
    # the other
    Card("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 49140, "NVIDIA/DCGM#283 (nvidia-smi: 49140MiB, ECC "
                                                                  "off)"),
    Card("rtx-a6000", "NVIDIA RTX A6000", 49140, "noonghunna/club-3090#1047 (49140 MiB, ECC off)"),
    Card("rtx-a6000-ecc", "NVIDIA RTX A6000", 46068, "thamada/gls@ecc9fb5 gls/RTX_A6000_x9_smi.py (nvidia-smi: "
                                                     "46068MiB, ECC Current: Enabled)"),
    Card("rtx-3090", "NVIDIA GeForce RTX 3090", 24576, "noonghunna/club-3090#390 (nvidia-smi: 24576MiB)"),
    Card("mi300x", "AMD Instinct MI300X", 196592, "ROCm/legacy-rocm-build#4750 (rocm-smi: VRAM Total Memory (B) "
                                                  "206141652992)"),
)

#: names of machines whose GPU shares the host's memory: planned as not modelled, never as a discrete card
UNIFIED = ("gb10", "dgx spark", "dgx-spark", "gh200", "jetson", "thor")


def card(text: str) -> Card:
    """A card by its key (``h100``) or its tool's name, case and spaces aside."""
    low = text.strip().lower()
    if any(u in low for u in UNIFIED):
        raise KvauditError(f"--gpu {text!r}: a unified-memory machine (the GPU shares the host's memory): not "
                           "modelled by kvaudit plan (the engines read T from cudaMemGetInfo, which counts the page "
                           "cache and every other process; a card's total less a driver reserve is not it)")
    want = low.replace(" ", "").replace("_", "-")
    for c in CARDS:
        if want in (c.key, c.name.lower().replace(" ", "")):
            return c
    raise KvauditError(f"--gpu {text!r}: not a card kvaudit knows ({', '.join(c.key for c in CARDS)}); give its "
                       "memory as --gpu-memory-gib (nvidia-smi's memory.total / 1024)")
