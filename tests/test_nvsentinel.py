"""The NVSentinel sink (issue 37, item 2): kvaudit's findings as NVSentinel HealthEvents, read by a stand-in
for its platform connector built from the published proto (tests/nvsentinel_stub.py: protobuf's own strict JSON
parser) and validated against the JSON Schema transcribed from it. A node problem names its GPU by index and
UUID and asks for remediation; a configuration finding is observation-only; checks that were not made say
nothing healthy."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from kvaudit.check import CheckOptions, HostAudit, check
from kvaudit.collect.interface import Unreachable
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.report import nvsentinel
from tests.conftest import FIXTURES, ROOT, cli

pytest.importorskip("google.protobuf")
from tests.nvsentinel_stub import enum_name, receive  # noqa: E402

CAPTURE = FIXTURES / "hosts" / "kimi-k25-tp8"
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "nvsentinel-health-events.schema.json").read_text())
GPU3_UUID = "GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c000003"
AT = 1_796_000_000.25


@pytest.fixture(scope="module")
def shared_gpu(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cap") / "gpu-shared"
    shutil.copytree(CAPTURE, d)
    with (d / "nvidia-smi-apps.csv").open("a") as fh:
        fh.write(f"77001, {GPU3_UUID}, python3 train.py, 6144\n")
    return d


def events_of(name: str, h: HostAudit):
    text = nvsentinel.render([(name, h)], AT)
    jsonschema.validate(json.loads(text), SCHEMA, format_checker=jsonschema.FormatChecker())
    return receive(text)


def by_check(msg) -> dict:
    return {e.checkName: e for e in msg.events}


def test_a_healthy_host_clears_every_node_check():
    h = check(str(CAPTURE), CheckOptions(AuditOptions()))
    msg = events_of("gpu-node-07", h)
    assert msg.version == 1
    checks = by_check(msg)
    assert set(checks) == {"KvauditForeignProcess", "KvauditOccupiedAtStartup", "KvauditGpuCountMismatch",
                           "KvauditGpuReadings"}
    for e in msg.events:
        assert e.isHealthy and not e.isFatal and e.agent == "kvaudit" and e.nodeName == "gpu-node-07"
        assert enum_name("ProcessingStrategy", e.processingStrategy) == "EXECUTE_REMEDIATION"
        assert enum_name("RecommendedAction", e.recommendedAction) == "NONE"
        assert e.generatedTimestamp.ToJsonString() == "2026-11-30T00:53:20.250Z"


def test_a_node_problem_names_the_gpu_and_a_config_finding_is_observation_only(shared_gpu):
    h = check(str(shared_gpu), CheckOptions(AuditOptions(mem_fraction_static=0.5)))
    checks = by_check(events_of("gpu-node-07", h))
    foreign = checks["KvauditForeignProcess"]
    assert not foreign.isHealthy and foreign.isFatal and foreign.componentClass == "GPU"
    assert [(x.entityType, x.entityValue) for x in foreign.entitiesImpacted] == [("GPU", "3"), ("GPU_UUID", GPU3_UUID)]
    assert list(foreign.errorCode) == ["FOREIGN_PROCESS"] and "pid 77001" in foreign.message
    assert enum_name("RecommendedAction", foreign.recommendedAction) == "CUSTOM"
    assert "nvidia-smi" in foreign.customRecommendedAction
    assert enum_name("ProcessingStrategy", foreign.processingStrategy) == "EXECUTE_REMEDIATION"
    assert foreign.metadata["problem"] == "node" and foreign.metadata["engine"] == "sglang"
    config = checks["KvauditTokensMismatch"]
    assert not config.isHealthy and not config.isFatal and not config.entitiesImpacted
    assert enum_name("ProcessingStrategy", config.processingStrategy) == "STORE_ONLY"
    assert enum_name("RecommendedAction", config.recommendedAction) == "NONE"
    assert config.componentClass == "InferenceEngine" and config.metadata["problem"] == "config"
    # the other node checks held: healthy, and the foreign process's check is not also called healthy
    assert checks["KvauditOccupiedAtStartup"].isHealthy and checks["KvauditGpuReadings"].isHealthy


def test_what_was_not_seen_is_not_called_healthy():
    down = HostAudit("gpu-9", None, None, (), (), Unreachable("connection refused"))
    msg = events_of("gpu-9", down)
    assert len(msg.events) == 1
    e = msg.events[0]
    assert e.checkName == "KvauditNotAudited" and not e.isHealthy and not e.isFatal
    assert enum_name("ProcessingStrategy", e.processingStrategy) == "STORE_ONLY"
    # a pod or an endpoint gives no GPU readings by design: the audit's checks, but nothing about GPUs
    h = check(str(CAPTURE), CheckOptions(AuditOptions()))
    msg = events_of("gpu-node-07", replace(h, gpus=(), findings=()))
    assert not [e for e in msg.events if e.componentClass == "GPU"]


def test_the_cli_writes_the_events_file(shared_gpu, tmp_path):
    out = tmp_path / "events.json"
    r = cli("check", str(shared_gpu), "--nvsentinel-events", str(out))
    assert r.code == 1, r.stderr  # the check's own exit status (warnings), unchanged by the sink
    msg = receive(out.read_text())
    assert "KvauditForeignProcess" in by_check(msg) and msg.events[0].nodeName == "gpu-node-07"
    r = cli("check", str(shared_gpu), "--nvsentinel-events", str(tmp_path / "no" / "such" / "dir" / "e.json"))
    assert r.code == 2 and r.stderr.startswith("kvaudit: error: cannot write the NVSentinel events")
    assert "\n" not in r.stderr.rstrip("\n")


def test_the_stub_rejects_what_the_proto_does_not_define():
    """The stand-in is strict, so the tests above can fail: a misspelt field, an undefined enum name."""
    from google.protobuf.json_format import ParseError

    for bad in ({"version": 1, "events": [{"check_name_typo": "x"}]},
                {"version": 1, "events": [{"recommendedAction": "REBOOT"}]},
                {"version": 1, "events": [{"generatedTimestamp": "yesterday"}]}):
        with pytest.raises(ParseError):
            receive(json.dumps(bad))
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)
