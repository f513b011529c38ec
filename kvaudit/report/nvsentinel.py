"""Health events for NVIDIA NVSentinel (issue 37, item 2): ``kvaudit check TARGET --nvsentinel-events FILE``.

NVSentinel's health monitors send ``HealthEvents`` to its platform connector (gRPC service
``datamodels.PlatformConnector/HealthEventOccurredV1`` on the node's unix socket). The event is defined in
NVIDIA/NVSentinel ``data-models/protobufs/health_event.proto`` at commit
d87e98588030e23f81a64d3f747bd46dd3efd7a2 (messages ``HealthEvents``, ``HealthEvent``, ``Entity``; enums
``RecommendedAction`` and ``ProcessingStrategy``). kvaudit writes that message in protobuf's canonical JSON
mapping (field names as in the proto, enums by name, ``generatedTimestamp`` as an RFC 3339 UTC string, default
values left out), which ``grpcurl -d @`` sends as it is (contrib/nvsentinel/send-events.sh).

What kvaudit says, and how (docs/fleet.md, "NVSentinel"):

- a **node** problem (kvaudit.health: another process's memory on a GPU, memory held before the engine started,
  GPUs missing or unreadable) is an unhealthy, fatal event (the health check's CRITICAL) with
  ``processingStrategy: EXECUTE_REMEDIATION``; a problem on given GPUs names each as NVSentinel's monitors do,
  ``{entityType: GPU, entityValue: <index>}`` and ``{entityType: GPU_UUID, entityValue: <uuid>}``. Its
  ``recommendedAction`` is ``CUSTOM``, with what frees the memory in ``customRecommendedAction``: no reset or
  reboot of the GPU is the fix for another process's allocation;
- a **configuration** finding (the engine's settings) is ``STORE_ONLY``: observation only, persisted and exported,
  never a change to the cluster (no cordon, no drain), ``isFatal: false``, ``recommendedAction: NONE``;
- a node check with no problem this time is a healthy event (``isHealthy: true``), which clears an earlier one
  of the same ``checkName``;
- a host kvaudit could not audit gets one ``STORE_ONLY`` event saying why, and no healthy ones: nothing was seen.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any, Iterable

from kvaudit import __version__
from kvaudit.health import NO_GPU_READINGS, Problem, assess
from kvaudit.textsafe import printable

#: the upstream definition this module writes (cited in the docstring)
UPSTREAM = ("NVIDIA/NVSentinel", "data-models/protobufs/health_event.proto",
            "d87e98588030e23f81a64d3f747bd46dd3efd7a2")
#: HealthEvent.version / HealthEvents.version as NVSentinel's own monitors set them
EVENT_VERSION = 1
AGENT = "kvaudit"
#: the proto's enum names (RecommendedAction, ProcessingStrategy) that kvaudit uses
NONE, CUSTOM = "NONE", "CUSTOM"
EXECUTE_REMEDIATION, STORE_ONLY = "EXECUTE_REMEDIATION", "STORE_ONLY"
#: componentClass: "GPU" as NVSentinel's GPU monitors write it; the engine's settings are software on the node
GPU_CLASS, ENGINE_CLASS = "GPU", "InferenceEngine"
#: the node checks that need the engine's audit and the GPUs' readings, and what each one's healthy event says
#: (a healthy event clears an earlier unhealthy one of the same checkName)
AUDITED_CLEAR = {
    "FOREIGN_PROCESS": "kvaudit finds no other process's memory on the engine's GPUs",
    "OCCUPIED_AT_STARTUP": "kvaudit finds no GPU memory held before the engine started",
    "GPU_COUNT_MISMATCH": "kvaudit matches every rank of the engine to a GPU",
}
#: the checks that need the host's processes too (ps read on the host: not from a capture, a pod or an endpoint)
PROCESSES_CLEAR = {
    "ORPHANED_ENGINE_PROCESS": "kvaudit finds no engine process an earlier start left",
    "IDLE_TENANT_MEMORY": "kvaudit finds no stopped, swapped-out or sleeping process holding the engine's GPUs",
}
READINGS_CLEAR = "kvaudit read the node's GPUs"


def check_name(code: str) -> str:
    """``FOREIGN_PROCESS`` -> ``KvauditForeignProcess`` (NVSentinel's check names are CamelCase; the check of the
    GPUs' readings is ``KvauditGpuReadings``, healthy or not)."""
    code = "GPU_READINGS" if code == NO_GPU_READINGS else code
    return "Kvaudit" + "".join(w.capitalize() for w in code.split("_"))


def timestamp(t: float) -> str:
    """google.protobuf.Timestamp in JSON: RFC 3339, UTC, "Z", 0 or 3 fractional digits."""
    d = datetime.fromtimestamp(t, tz=timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + (f".{d.microsecond // 1000:03d}" if d.microsecond >= 1000 else "") + "Z"


def _gpus_of(p: Problem) -> list[int]:
    f = p.fields
    many = f.get("gpus")
    gpus: list[Any] = many if isinstance(many, list) else ([f["gpu"]] if "gpu" in f else [])
    return sorted({g for g in gpus if isinstance(g, int) and not isinstance(g, bool)})


def _entities(p: Problem, h: Any) -> list[dict[str, str]]:
    uuids = {g.index: g.uuid for g in h.gpus}
    out: list[dict[str, str]] = []
    for i in _gpus_of(p):
        out.append({"entityType": "GPU", "entityValue": str(i)})
        if uuids.get(i):
            out.append({"entityType": "GPU_UUID", "entityValue": printable(uuids[i])})
    return out


def _clean(text: str, limit: int = 1000) -> str:
    return re.sub(r"\s+", " ", printable(text)).strip()[:limit]


def host_events(node: str, h: Any, at: float) -> list[dict[str, Any]]:
    """One host's events (``node``: the name NVSentinel knows it by, a Kubernetes node's name)."""
    v = assess(node, h)
    base = {"version": EVENT_VERSION, "agent": AGENT, "generatedTimestamp": timestamp(at), "nodeName": node}
    meta = {"kvaudit_version": __version__, "engine": v.engine or "", "engine_version": v.engine_version or "",
            "state": v.state}
    if v.state == "unknown":
        return [{**base, "componentClass": ENGINE_CLASS, "checkName": check_name("NOT_AUDITED"), "isHealthy": False,
                 "message": _clean(v.headline), "recommendedAction": NONE, "errorCode": ["NOT_AUDITED"],
                 "metadata": meta, "processingStrategy": STORE_ONLY}]
    events = []
    for p in v.problems:
        node_problem = p.problem == "node"
        e: dict[str, Any] = {
            **base, "componentClass": GPU_CLASS if node_problem else ENGINE_CLASS, "checkName": check_name(p.code),
            "isHealthy": False, "message": _clean(p.message), "errorCode": [p.code],
            "metadata": {**meta, "problem": p.problem, "severity": p.severity},
            "processingStrategy": EXECUTE_REMEDIATION if node_problem else STORE_ONLY,
        }
        if node_problem:
            e["isFatal"] = True
            e["recommendedAction"] = CUSTOM
            e["customRecommendedAction"] = _clean(p.action, 300)
        else:
            e["recommendedAction"] = NONE
        entities = _entities(p, h)
        if entities:
            e["entitiesImpacted"] = entities
        events.append(e)
    # healthy only where kvaudit looked: GPUs read (a pod or an endpoint gives no readings), and for the checks
    # against the engine's ranks, an audited startup
    seen = {p.code for p in v.problems}
    clear: dict[str, str] = {}
    if h.gpus and NO_GPU_READINGS not in seen:
        clear[NO_GPU_READINGS] = READINGS_CLEAR
        if h.audit is not None:
            clear.update({c: m for c, m in AUDITED_CLEAR.items() if c not in seen})
            if h.collected is not None and h.collected.processes:
                clear.update({c: m for c, m in PROCESSES_CLEAR.items() if c not in seen})
    for code, message in clear.items():
        events.append({**base, "componentClass": GPU_CLASS, "checkName": check_name(code), "isHealthy": True,
                       "message": message, "recommendedAction": NONE, "metadata": meta,
                       "processingStrategy": EXECUTE_REMEDIATION})
    return events


def render(hosts: Iterable[tuple[str, Any]], at: float) -> str:
    """The ``HealthEvents`` message (JSON) for the hosts, each ``(node name, kvaudit.check.HostAudit)``."""
    from kvaudit.report.json import dumps

    return dumps({"version": EVENT_VERSION, "events": [e for n, h in hosts for e in host_events(n, h, at)]})
