"""A live server's documents: Prometheus text exposition (``/metrics``) -> samples, with the parser operators
already trust (``prometheus_client.parser``), and JSON documents. Engine-neutral: which metric or field means
what is each engine's endpoint module's."""

from __future__ import annotations

import json
import math
from dataclasses import field
from typing import Any

from kvaudit.record import record


@record
class Sample:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0


#: labels one sample may carry (vLLM's cache_config_info has about 20): prometheus_client's parser is quadratic in
#: a line's labels (300,000 on one line took 83 s), so a line over this is no reading
MAX_LABELS = 1_000


def _wanted(text: str, names: tuple[str, ...]) -> str:
    """Only the lines of the families ``names`` (their samples and ``# HELP``/``# TYPE`` lines), and none with
    more than :data:`MAX_LABELS` labels: the parse cost is that of the few lines read, not of the page."""
    keep = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[2] in names:
                keep.append(line)
            continue
        head = line.split("{", 1)[0].split(None, 1)
        if head and head[0] in names and line.count("=") <= MAX_LABELS:
            keep.append(line)
    return "\n".join(keep) + "\n" if keep else ""


def samples(text: str | None, names: tuple[str, ...] | None = None) -> list[Sample]:
    """Every finite sample of the page (of the families ``names`` only, when given: what an engine reads); an
    unparseable page gives none (it is not a metrics page)."""
    if not text:
        return []
    if names is not None:
        text = _wanted(text, names)
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


#: the longest integer an engine's document holds (a token count, bytes): a 4,000-digit number is no reading and
#: would overflow every float it meets (issue 21). Such a number reads as null: that field is missing, the rest
#: of the document stands.
MAX_INT_DIGITS = 30


def _bounded_int(text: str) -> int | None:
    return None if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def json_document(body: str | None) -> Any:
    """The parsed JSON document, or None (absent, malformed, or nested past the parser's depth). An integer of
    more than MAX_INT_DIGITS digits reads as null (NaN and Infinity are left to the readers, which check them)."""
    if not body:
        return None
    try:
        return json.loads(body, parse_int=_bounded_int)
    except (ValueError, RecursionError):
        return None
