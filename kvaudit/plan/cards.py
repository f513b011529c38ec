"""GPU cards by the memory nvidia-smi reports for them (``memory.total``, MiB), so a plan can start from a card
name. Each figure was read off real nvidia-smi output (public issue threads and our fixtures); a card not here is
given as ``--gpu-memory-gib``. What CUDA can use of it, and what is gone before the engine measures T (the
reserved memory, the CUDA context, NCCL), is the plan's T offset: calibrated from the history, or assumed."""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.errors import KvauditError


@dataclass(frozen=True)
class Card:
    key: str
    name: str  # as nvidia-smi names it
    total_mib: int


CARDS = (
    Card("a100-40g", "NVIDIA A100-SXM4-40GB", 40960),
    Card("a100-80g", "NVIDIA A100-SXM4-80GB", 81920),
    Card("h100", "NVIDIA H100 80GB HBM3", 81559),
    Card("h200", "NVIDIA H200", 143771),
    Card("b200", "NVIDIA B200", 183359),
    Card("l40s", "NVIDIA L40S", 46068),
    Card("rtx-4090", "NVIDIA GeForce RTX 4090", 24564),
    Card("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887),
)


def card(text: str) -> Card:
    """A card by its key (``h100``) or nvidia-smi's name, case and spaces aside."""
    want = text.strip().lower().replace(" ", "").replace("_", "-")
    for c in CARDS:
        if want in (c.key, c.name.lower().replace(" ", "")):
            return c
    raise KvauditError(f"--gpu {text!r}: not a card kvaudit knows ({', '.join(c.key for c in CARDS)}); give its "
                       "memory as --gpu-memory-gib (nvidia-smi's memory.total / 1024)")

