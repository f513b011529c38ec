"""Prometheus text exposition (a server's ``/metrics``) -> samples, with the parser operators already trust
(``prometheus_client.parser``). Engine-neutral: which metric means what is each engine's endpoint module's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0


def samples(text: str | None) -> list[Sample]:
    """Every finite sample of the page; an unparseable page gives none (it is not a metrics page)."""
    if not text:
        return []
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if isinstance(s.value, (int, float)) and math.isfinite(s.value):
                    out.append(Sample(s.name, dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError):
        return []
    return out


def first(found: list[Sample], name: str) -> Sample | None:
    return next((s for s in found if s.name == name), None)
