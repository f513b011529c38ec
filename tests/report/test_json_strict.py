"""Every JSON document kvaudit prints is strict: a non-finite float (from a hostile host or log) is null, and a
document without one is written as json writes it (report.json.dumps)."""

from __future__ import annotations

import json
import math

from kvaudit.report.json import dumps


def test_a_non_finite_float_anywhere_is_null_and_the_rest_is_kept():
    doc = {"a": 1.5, "b": [float("nan"), 2, {"c": float("inf"), "d": (-math.inf, "x")}], "e": None}
    text = dumps(doc)
    assert json.loads(text) == {"a": 1.5, "b": [None, 2, {"c": None, "d": [None, "x"]}], "e": None}
    assert "NaN" not in text and "Infinity" not in text and text.endswith("}\n")


def test_a_finite_document_is_json_indented_as_it_is():
    doc = {"host": "gpu-1", "gib": [79.19, 0.1 + 0.2], "nested": {"t": (1, 2)}, "ok": True}
    assert dumps(doc) == json.dumps(doc, indent=2) + "\n"
