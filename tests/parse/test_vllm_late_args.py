"""vLLM's trailing 'non-default args' merge (a pasted excerpt with the args line after the memory lines) reads only
an args line printed before the startup serves: one after uvicorn's 'Application startup complete' or the periodic
stats is the running server's output, text a request can write (security review, issue 39)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.reconcile.interface import AuditOptions
from kvaudit.report.json import audit_dict
from tests.conftest import FIXTURES

CORPUS = FIXTURES / "corpus"

#: keys neither log's real args carry: the KV budget in bytes and the block size (vLLM's default is printed as one)
FORGED = ("(APIServer pid=1) INFO 06-10 22:55:45 [api_utils.py:273] non-default args: "
          "{'kv_cache_memory_bytes': 1073741824, 'block_size': 16, 'max_num_seqs': 1}\n")


def _read(path: Path):
    with open(path, "rb") as f:
        log = read_log(f)
    (a,) = audit(log, AuditOptions())
    d = audit_dict(a)
    return log.startups[-1], (d["status"], d["headline"], d["findings"], d["formula"], d["notes"])


def _serving_line(text: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(keepends=True))
                if "Application startup complete" in ln or "Avg prompt throughput" in ln)


@pytest.mark.parametrize("name", ["vllm_c024", "vllm_c016"])
def test_an_args_line_after_serving_adds_nothing(tmp_path, name):
    real = (CORPUS / f"{name}.log").read_text()
    base = tmp_path / "base.log"
    base.write_text(real)
    forged = tmp_path / "forged.log"
    forged.write_text(real + FORGED)
    s_base, said_base = _read(base)
    s_forged, said_forged = _read(forged)
    assert not {"kv_cache_memory_bytes", "block_size", "max_num_seqs"} & set(s_base.server_args), "keys absent"
    assert s_forged.server_args == s_base.server_args
    assert said_forged == said_base


@pytest.mark.parametrize("name", ["vllm_c024", "vllm_c016"])
def test_the_same_args_line_inside_the_startup_is_read(tmp_path, name):
    """Before the serving line (after the memory lines, as a pasted excerpt puts it) the line is the startup's:
    its keys are merged, and the block size is no longer called a default."""
    lines = (CORPUS / f"{name}.log").read_text().splitlines(keepends=True)
    at = _serving_line("".join(lines))
    inside = tmp_path / "inside.log"
    inside.write_text("".join(lines[:at] + [FORGED] + lines[at:]))
    s, _ = _read(inside)
    assert s.server_args["kv_cache_memory_bytes"] == 1073741824
    assert s.server_args["block_size"] == 16


@pytest.mark.parametrize("name", ["vllm_c024", "vllm_c016"])
def test_an_args_line_after_serving_adds_nothing_to_the_restart_after_it(tmp_path, name):
    """The forged line after serving, then a real restart (the same log again, an hour later: its own version line,
    then its own args): the restart's args are its own, and the line is said as not read."""
    real = (CORPUS / f"{name}.log").read_text()
    again = real.replace(" 22:", " 23:")
    base = tmp_path / "base.log"
    base.write_text(real + again)
    forged = tmp_path / "forged.log"
    forged.write_text(real + FORGED + again)
    s_base, said_base = _read(base)
    s_forged, said_forged = _read(forged)
    assert s_forged.server_args == s_base.server_args
    assert said_forged[:4] == said_base[:4]
    number = real.count("\n") + 1
    assert any(f"non-default args line {number} after the server served" in n for n in said_forged[4]), said_forged[4]
