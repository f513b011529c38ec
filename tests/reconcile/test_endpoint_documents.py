"""Whatever a server (or something posing as one) answers, the endpoint audits never raise: a document of any
JSON shape, or any Prometheus text, is read as far as it makes sense and no further."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvaudit.engines import audit_endpoint
from kvaudit.model_config import load_config
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import KIMI_CONFIG

GEOM = load_config(KIMI_CONFIG)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                    st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                          max_size=4), max_leaves=20)
keys = st.sampled_from(["mem_fraction_static", "tp_size", "dp_size", "page_size", "kv_cache_dtype", "dtype",
                        "enable_dp_attention", "version", "speculative_algorithm", "model_path"])
usage_keys = st.sampled_from(["weight", "kvcache", "token_capacity", "startup_available", "graph", "cuda_graph"])
server_info = st.fixed_dictionaries({
    "internal_states": st.lists(st.one_of(values, st.fixed_dictionaries(
        {"memory_usage": st.dictionaries(usage_keys, values, max_size=6)})), max_size=3)},
    optional={"mem_fraction_static": values, "tp_size": values, "dp_size": values, "page_size": values,
              "enable_dp_attention": values, "version": values}).map(lambda d: d)


@settings(max_examples=200, deadline=None)
@given(doc=server_info, extra=st.dictionaries(keys, values, max_size=4), geometry=st.booleans())
# found by this test in a full run: a pool with a capacity of 0 tokens implies no bytes per token
@example(doc={"internal_states": [{"memory_usage": {"kvcache": 1, "token_capacity": 0}}]}, extra={}, geometry=True)
def test_any_server_info_is_read_without_raising(doc, extra, geometry):
    body = json.dumps({**extra, **doc}, allow_nan=True)
    a = audit_endpoint({"/server_info": body}, "http://x:1", AuditOptions(model_geometry=GEOM if geometry else None))
    assert a is not None and a.engine == "sglang"


label_values = st.one_of(st.sampled_from(["16", "0", "-5", "None", "nan", "inf", "1e400", "auto", "fp8"]),
                         st.text(alphabet="0123456789.-e", max_size=6))


@settings(max_examples=200, deadline=None)
@given(labels=st.dictionaries(st.sampled_from(["num_gpu_blocks", "block_size", "cache_dtype", "gpu_memory_utilization",
                                               "kv_cache_size_tokens"]), label_values, max_size=5),
       geometry=st.booleans())
def test_any_cache_config_info_is_read_without_raising(labels, geometry):
    lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
    page = f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{lab}}} 1.0\n"
    a = audit_endpoint({"/metrics": page}, "http://x:1", AuditOptions(model_geometry=GEOM if geometry else None))
    assert a is not None and a.engine == "vllm"


@settings(max_examples=100, deadline=None)
@given(doc=values)
def test_any_metrics_json_is_read_without_raising(doc):
    audit_endpoint({"/metrics": json.dumps(doc, allow_nan=True)}, "http://x:1", AuditOptions())
