#!/usr/bin/env python3
"""Render docs/support.md from kvaudit/support/<engine>.toml (the tables the verdict consults).

    python scripts/support_page.py            # rewrite docs/support.md
    python scripts/support_page.py --check    # exit 1 when docs/support.md is not what the tables give
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvaudit import support  # noqa: E402

PAGE = ROOT / "docs" / "support.md"
TITLES = {"pool": "Pool kinds", "kv_dtype": "KV cache dtypes", "platform": "Platforms"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    L = ["# What kvaudit checks", "",
         "Per engine, which release ranges, pool kinds, KV cache dtypes and platforms kvaudit models (`modelled`: "
         "checked to the digit), models in part (`partly`: checked, with what is not modelled said in the report's "
         "notes) or does not model (`not`: the report says \"not modelled here\" and judges nothing that rests on "
         "it: no pool verdict, no geometry finding, no advice). A release range the table does not list is not "
         "modelled. Each row names the upstream code it was read from.", "",
         "Generated from `kvaudit/support/<engine>.toml` by `python scripts/support_page.py` (the same files the "
         "verdict reads; `tests/test_support.py` keeps this page equal to them). The rule is the verdict's rule 7 "
         "([findings](findings.md#the-verdicts-rules)).", ""]
    order = ["sglang", "vllm", "trtllm", "lmdeploy"]
    for engine in sorted(support.engines(), key=lambda e: (order.index(e) if e in order else len(order), e)):
        L += [f"## {support.display(engine)}", ""]
        rows = support.table(engine)
        for dim in support.DIMENSIONS:
            mine = [r for r in rows if r.dimension == dim]
            if not mine:
                continue
            L += [f"### {TITLES[dim]}", "", "| kind | releases | level | upstream | not modelled |",
                  "|---|---|---|---|---|"]
            for r in mine:
                L.append(f"| {support.KIND_WORDS.get(r.kind, r.kind)} (`{r.kind}`) | {r.releases} | {r.level} | "
                         f"{_cell(r.source)} | {_cell(r.note)} |")
            L.append("")
    return "\n".join(L).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is not what kvaudit/support gives: run python scripts/support_page.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
