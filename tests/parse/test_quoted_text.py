"""Engine-looking text inside a quoted value (a prompt some logger prints, a path, a JSON record) is data, never
a startup line: each grammar decides on the line with its quoted literals masked (issue 10, item 9)."""

from __future__ import annotations

import io
import json

import pytest

from kvaudit.explain import audit, read_log
from kvaudit.parse.interface import mask_quoted
from kvaudit.reconcile.interface import AuditOptions
from tests.conftest import FIXTURES, SAMPLES


def _summary(text: str):
    log = read_log(io.BytesIO(text.encode()))
    (a,) = audit(log, AuditOptions())
    last = log.startups[-1]
    return (log.engine.name, len(log.startups), len(last.events), last.model_path, dict(last.server_args or {}),
            a.formula, [(r.label, r.logged) for r in a.ranks])


# Each forged line carries no request marker of any engine (another logger, a proxy, a tokenizer debug line):
# what keeps it out is that the engine-looking text sits inside quotes. "GB" before the quote is an anchor of
# every grammar, so the line is selected and parsed, and must still give nothing.
FORGED = {
    "sglang_029.log": (
        "[2025-02-04 05:30:00 TP0] tokenizer: decoded 12 GB prompt text='server_args=ServerArgs(model_path="
        "\"/etc/evil\", mem_fraction_static=0.1) Load weight end. type=Evil, avail mem=1.00 GB, mem usage=1.00 GB. "
        "KV Cache is allocated. #tokens: 5, K size: 0.01 GB, V size: 0.01 GB max_total_num_tokens=5'\n"
    ),
    "vllm_106.log": (
        "(APIServer pid=1) INFO 07-09 03:00:00 [chat_utils.py:470] Detected 1 GB template content: \"INFO 07-09 "
        "[gpu_worker.py:508] Available KV cache memory: 99.00 GiB\", 'Model loading took 99.00 GiB memory'\n"
        "(APIServer pid=1) INFO 07-09 03:00:01 [chat_utils.py:470] Detected 1 GB template content: "
        "\"non-default args: {'model': '/etc/evil', 'gpu_memory_utilization': 0.1}\"\n"
    ),
    "trtllm_001.log": (
        "[12/20/2025-04:30:00] [TRT-LLM] [I] 1 GB echo: '[TensorRT-LLM][INFO] [MemUsageChange] Allocated 99.00 GiB "
        "for max tokens in paged KV cache (5).', \"Use 1.00 GB for model weights.\", '/etc/evil/models--x--y/"
        "snapshots/0123456789abcdef'\n"
    ),
}


@pytest.mark.parametrize("sample", sorted(FORGED))
def test_quoted_startup_text_changes_nothing(sample):
    real = (SAMPLES / sample).read_text()
    forged = real + FORGED[sample] * 3
    assert _summary(forged) == _summary(real)
    assert "/etc/evil" not in str(_summary(forged))


@pytest.mark.parametrize("sample", sorted(FORGED))
def test_the_same_text_unquoted_is_read(sample):
    """The guard is the quoting, not the words: the forged payload, stripped of its quotes, does change the
    audit (so the test above would fail if quoted text were read)."""
    real = (SAMPLES / sample).read_text()
    bare = FORGED[sample].replace("'", " ").replace('"', " ")
    # inside the startup: after its completion such lines are set aside whatever they say (request_time)
    head, rest = real.split("\n", 1)
    assert _summary(head + "\n" + bare * 3 + rest) != _summary(real)


@pytest.mark.parametrize("text, masked", [
    ("a text='Load weight end' b", "a text='xxxxxxxxxxxxxxx' b"),
    ("ValueError: the model's max seq len (9) 'kv' x", "ValueError: the model's max seq len (9) 'xx' x"),
    ("p='it's GB', q=\"a\\\"b\"", "p='xxxxxxx', q=\"xxxx\""),
    ("cut short: 'Load weight end. avail", "cut short: 'xxxxxxxxxxxxxxxxxxxxxx"),
    ("no quotes at all", "no quotes at all"),
])
def test_mask_quoted(text, masked):
    assert mask_quoted(text) == masked
    assert len(mask_quoted(text)) == len(text)


@pytest.mark.parametrize("key", ["MESSAGE", "log"])
def test_json_records_are_read_by_their_message(key):
    """journalctl -o json and docker's json-file lines: the message is unwrapped (its quotes would otherwise
    mask every engine line), with journald's byte-array form for messages holding control bytes."""
    real = (SAMPLES / "sglang_029.log").read_text()
    lines = real.splitlines()
    records = []
    for i, line in enumerate(lines):
        value = list((line + ("\n" if key == "log" else "")).encode()) if i % 5 == 0 and key == "MESSAGE" \
            else line + ("\n" if key == "log" else "")
        records.append(json.dumps({key: value, "stream": "stdout", "_PID": "7"}, separators=(",", ":")))
    assert _summary("\n".join(records) + "\n") == _summary(real)


def test_vllm_lines_that_name_the_model_must_be_the_engines_own():
    """issue 21, item 6, for vLLM: the banner and 'non-default args' name the model whose config.json check reads;
    without vLLM's logger prefix before them ("INFO 11-05 12:00:00 [utils.py:278] ") they are not the engine's."""
    real = (FIXTURES / "vllm_classes" / "kv-needed-0.31.log").read_bytes()
    forged = b"non-default args: {'model': '/root/.ssh', 'gpu_memory_utilization': 0.1}\n"
    head, rest = real.split(b"\n", 2)[:2], real.split(b"\n", 2)[2]
    for extra in (forged, b"GET /x Initializing a V1 LLM engine (v0.31.0) with config: model='/root/.ssh'\n"):
        # right after the engine's own args line, where a later config would win
        parsed = read_log(io.BytesIO(b"\n".join(head) + b"\n" + extra + rest))
        assert parsed.engine.name == "vllm"
        assert parsed.startups[-1].model_path == "/models/Meta-Llama-3-8B", extra
