"""The JSON contract of docs/json.md: every documented key present, absent values null."""

from __future__ import annotations

import re

import pytest

from tests.conftest import KIMI_CONFIG, KIMI_LOG, ROOT, SAMPLES, cli

REQUIRED = {
    "": ["engine", "engine_version", "source", "startup", "model", "speculative", "formula", "ranks", "findings",
         "hicache_host_gb", "notes", "schema_version"],
    "formula": ["mem_fraction_static", "mem_fraction_static_source", "pre_load_free_gib", "post_load_free_gib",
                "reserve_gib", "rest_gib", "bytes_per_token", "bytes_per_token_source", "predicted_tokens",
                "logged_tokens", "verdict"],
    "ranks[]": ["rank", "label", "weights_gib", "kv_gib", "free_after_weights_gib", "free_after_pool_gib",
                "pre_load_free_gib", "free_at_end_gib", "unexplained_gib", "items"],
    "findings[]": ["code", "severity", "message", "fields", "ranks"],
}


def _check(doc: dict) -> None:
    for key in REQUIRED[""]:
        assert key in doc, key
    for key in REQUIRED["formula"]:
        assert key in doc["formula"], key
    for r in doc["ranks"]:
        for key in REQUIRED["ranks[]"]:
            assert key in r, key
    for f in doc["findings"]:
        for key in REQUIRED["findings[]"]:
            assert key in f, key
        assert f["severity"] in ("info", "warning", "error")


def test_kimi_json():
    d = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG, "-f", "json").json()
    _check(d)
    f = d["formula"]
    assert d["engine"] == "sglang"
    assert f["pre_load_free_gib"] == 94.01 and f["bytes_per_token"] == 70272
    assert f["predicted_tokens"]["low"] <= f["logged_tokens"] == 159277 <= f["predicted_tokens"]["high"]
    assert f["verdict"] == "match" and f["mem_fraction_static_source"] == "server_args"
    assert len(d["ranks"]) == 8 and d["ranks"][0]["kv_gib"] == 10.42
    assert "RESERVE_EXPLAINS_FREE" in {x["code"] for x in d["findings"]}


@pytest.mark.parametrize("name", sorted(p.stem for p in SAMPLES.glob("sglang_*.log")))
def test_every_sample_keeps_the_contract_with_nulls(name):
    d = cli("explain", SAMPLES / f"{name}.log", "-f", "json").json()
    _check(d)
    if d["formula"]["verdict"] == "unknown":
        assert d["formula"]["predicted_tokens"] is None


def test_docs_list_every_key():
    doc = (ROOT / "docs" / "json.md").read_text()
    for section, keys in REQUIRED.items():
        for key in keys:
            assert re.search(rf"`{re.escape(key)}`", doc), f"docs/json.md does not document {section}.{key}"
