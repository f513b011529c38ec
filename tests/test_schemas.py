"""Every JSON document kvaudit writes validates against its published schema (issue 37, item 3): docs/schemas/
(JSON Schema draft 2020-12), checked with jsonschema over every corpus log's audit, the golden JSON files, and
the real CLI's output of every command that writes JSON: explain, whatif, check (an audited host, a shared GPU,
a host that could not be audited), the health check, fleet (with its history), history, plan, plan --validate
and diff. The status every output carries is one of exactly ok, unchecked, warning, error, partial and
failed:<reason>."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
referencing = pytest.importorskip("referencing")

from kvaudit.check import HostAudit  # noqa: E402
from kvaudit.collect.interface import Unreachable  # noqa: E402
from kvaudit.health import assess  # noqa: E402
from kvaudit.report.host import host_dict  # noqa: E402
from kvaudit.report.json import audit_dict, dumps  # noqa: E402
from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, ROOT, cli  # noqa: E402
from tests.corpus_run import CORPUS, audit_entry  # noqa: E402

SCHEMAS = ROOT / "docs" / "schemas"
CAPTURE = FIXTURES / "hosts" / "kimi-k25-tp8"
GOLDEN = FIXTURES / "golden"
CORPUS_ENTRIES = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))["logs"]
#: every kind of document and the schema that describes it
KINDS = ("audit", "whatif", "check", "fleet", "health", "plan", "plan-validation", "diff", "history",
         "nvsentinel-health-events")


def _load() -> tuple[dict[str, dict], referencing.Registry]:
    docs = {p.name.removesuffix(".schema.json"): json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")}
    registry = referencing.Registry().with_resources(
        (d["$id"], referencing.Resource.from_contents(d)) for d in docs.values())
    return docs, registry


DOCS, REGISTRY = _load()


def validate(kind: str, doc) -> None:
    """Raises jsonschema.ValidationError, naming the path, when ``doc`` is not a ``kind`` document."""
    v = jsonschema.Draft202012Validator(DOCS[kind], registry=REGISTRY, format_checker=jsonschema.FormatChecker())
    errors = sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        raise jsonschema.ValidationError(f"{kind}: at {'/'.join(map(str, e.absolute_path)) or '/'}: {e.message}")


def test_every_schema_is_a_valid_draft_2020_12_schema_and_every_kind_has_one():
    assert set(KINDS) | {"common"} == set(DOCS)
    for name, d in DOCS.items():
        assert d["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        assert d["$id"].endswith(f"/{name}.schema.json")
        jsonschema.Draft202012Validator.check_schema(d)


@pytest.mark.parametrize("status", ["ok", "unchecked", "warning", "error", "partial", "failed:unreachable",
                                    "failed:host_key"])
def test_the_status_set_is_accepted(status):
    jsonschema.Draft202012Validator(DOCS["common"]["$defs"]["status"]).validate(status)


@pytest.mark.parametrize("status", ["OK", "fine", "failed", "failed:", "failed:Unreachable", "match", "critical",
                                    "ok "])
def test_nothing_else_is_a_status(status):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(DOCS["common"]["$defs"]["status"]).validate(status)


@pytest.mark.parametrize("name", sorted(n for n in CORPUS_ENTRIES if (CORPUS / f"{n}.log").exists()))
def test_every_corpus_logs_audit_validates(name):
    doc = json.loads(dumps(audit_dict(audit_entry(name, CORPUS_ENTRIES[name]))))
    validate("audit", doc)


def test_the_golden_json_files_validate():
    """The golden files that are JSON (by name: <schema kind>-*.json); today's goldens are text and Markdown."""
    goldens = sorted(GOLDEN.glob("*.json"))
    for g in goldens:
        kind = next(k for k in sorted(KINDS, key=len, reverse=True) if g.name.startswith(k + "-"))
        validate(kind, json.loads(g.read_text()))
    # the text goldens' JSON twin: the same inputs through --format json
    r = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG, "-f", "json")
    validate("audit", json.loads(r.stdout))
    r = cli("whatif", KIMI_LOG, "--mem-fraction-static", "0.92", "-m", KIMI_CONFIG, "-f", "json")
    assert r.code in (0, 1), r.stderr
    validate("whatif", json.loads(r.stdout))


@pytest.fixture(scope="module")
def shared_gpu(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cap") / "gpu-shared"
    shutil.copytree(CAPTURE, d)
    with (d / "nvidia-smi-apps.csv").open("a") as fh:
        fh.write("77001, GPU-3f9a1c2e-7d41-4c55-9e0b-5a1d7c000003, python3 train.py, 6144\n")
    return d


def test_check_and_health_documents_validate(shared_gpu):
    for target, extra in ((CAPTURE, ()), (shared_gpu, ()), (CAPTURE, ("--mem-fraction-static", "0.5"))):
        r = cli("check", target, *extra, "-f", "json")
        validate("check", json.loads(r.stdout))
        r = cli("check", target, *extra, "--health-check", "-f", "json")
        validate("health", json.loads(r.stdout))
    down = HostAudit("gpu-9", None, None, (), (), Unreachable("connection refused"))
    doc = json.loads(dumps(host_dict(down)))
    assert doc["status"] == "failed:unreachable"
    validate("check", doc)
    validate("health", json.loads(dumps(assess("gpu-9", down).as_dict("npd"))))
    with pytest.raises(jsonschema.ValidationError):
        validate("check", {**doc, "status": "down"})
    with pytest.raises(jsonschema.ValidationError):
        validate("health", {**assess("gpu-9", down).as_dict("npd"), "state": "CRITICAL"})


@pytest.fixture(scope="module")
def history_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("history") / "history.sqlite"


def test_fleet_and_history_documents_validate(shared_gpu, history_file, tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"{CAPTURE}\n{shared_gpu}\n")
    hist = history_file
    for _ in range(2):
        r = cli("fleet", inv, "-f", "json", "--history", hist)
        doc = json.loads(r.stdout)
        validate("fleet", doc)
    assert len(doc["hosts"]) == 2 and doc["run"]["first_run"] is False
    r = cli("history", "--history", hist, "-f", "json")
    assert r.code == 0, r.stderr
    validate("history", json.loads(r.stdout))
    name = doc["hosts"][0]["name"]
    r = cli("history", name, "--history", hist, "-f", "json")
    assert r.code == 0, r.stderr
    one = json.loads(r.stdout)
    assert len(one["runs"]) == 2
    validate("history", one)


def test_plan_validation_and_diff_documents_validate(shared_gpu, history_file):
    if not history_file.exists():  # run alone: the fleet's history the plan calibrates on
        inv = history_file.with_name("hosts.ini")
        inv.write_text(f"{CAPTURE}\n")
        assert cli("fleet", inv, "--history", history_file).code in (0, 1)
    r = cli("plan", KIMI_CONFIG, "--engine", "sglang==0.5.9", "--gpu", "rtx-pro-6000", "--tp", "8", "--fraction",
            "0.9", "--history", history_file, "-f", "json")
    assert r.code == 0, r.stderr
    validate("plan", json.loads(r.stdout))
    r = cli("plan", "--validate", CORPUS, "-f", "json")
    assert r.code == 0, r.stderr
    validate("plan-validation", json.loads(r.stdout))
    r = cli("diff", CAPTURE, shared_gpu, "-f", "json")
    assert r.code in (0, 1), r.stderr
    validate("diff", json.loads(r.stdout))


def test_a_document_that_breaks_the_contract_is_rejected():
    """The schemas can fail: a required key gone, a finding code that is not one, a count of the wrong type."""
    name = next(iter(sorted(CORPUS_ENTRIES)))
    doc = json.loads(dumps(audit_dict(audit_entry(name, CORPUS_ENTRIES[name]))))
    for broken in ({k: v for k, v in doc.items() if k != "formula"},
                   {**doc, "findings": [{"code": "tokens mismatch", "severity": "warning", "message": "m",
                                         "ranks": [], "fields": {}, "ignored": False}]},
                   {**doc, "formula": {**doc["formula"], "verdict": "MATCH"}},
                   {**doc, "ranks": [{"rank": "0"}]}):
        with pytest.raises(jsonschema.ValidationError):
            validate("audit", broken)
