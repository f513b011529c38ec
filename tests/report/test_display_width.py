"""The terminal report at 60 and 80 columns (ux-audit items 4 and 24): the per-GPU table never drops a column that
holds a value without saying so under it, each row still adds up to T from what is shown, the legend names only what
is shown, and the Formula table stays aligned, all within the width. The real CLI on the real fixtures the audit
names."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len

from kvaudit.cli import Environment, run
from tests.conftest import FIXTURES

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"


def at(columns: int, *args) -> tuple[int, list[str]]:
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdin=io.BytesIO(b""), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                      environ={"NO_COLOR": "1", "COLUMNS": str(columns)})
    code = run([str(a) for a in args], env)
    return code, out.getvalue().splitlines()


def section(lines: list[str], title: str) -> list[str]:
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start + 1:end]


@pytest.mark.parametrize("columns", [60, 80])
def test_per_gpu_rows_add_up_from_what_is_shown(columns):
    code, lines = at(columns, "check", KIMI_HOST)
    assert code == 0
    assert not [x for x in lines if cell_len(x) > columns]
    gpu = section(lines, "Per GPU (GiB)")
    header = gpu[0].split()
    body = [x for x in gpu[1:] if x.startswith("  TP")]
    notes = " ".join(x.strip() for x in gpu if not x.startswith("  TP") and x is not gpu[0])
    folded = dict(re.findall(r"(graphs|draft|other|free@pool) (\d+\.\d\d)", notes.split("T: ")[0]))
    if columns == 60:  # graphs, draft and other do not fit: their values are said, not dropped
        assert "not shown at this width:" in notes and {"graphs", "draft", "other"} <= set(folded), notes
    for row in body:
        cells = dict(zip(header, row.split()))
        items = sum(float(cells.get(k, folded.get(k, 0))) for k in ("weights", "KV", "graphs", "draft", "other"))
        assert abs(float(cells["T"]) - items - float(cells["free@end"]) - float(cells["unexpl."])) < 0.03, row
    legend = notes.split("not shown at this width:")[-1]
    for name in ("graphs", "draft", "other", "free@pool"):  # the legend explains each column shown, in the table or not
        assert (f"{name}:" in legend) == (name in header or name in folded), (name, legend)


@pytest.mark.parametrize("columns", [60, 80])
@pytest.mark.parametrize("log", ["trtllm_c013", "lmdeploy_c004"])
def test_formula_table_is_aligned_within_the_width(columns, log):
    _, lines = at(columns, "explain", FIXTURES / "corpus" / f"{log}.log")
    assert not [x for x in lines if cell_len(x) > columns]
    table = section(lines, "Formula")
    value = re.compile(r"  ((?:-|~?[\d,.]+(?:\.\.[\d,]+)?)(?: GiB)?)(?:   |$)")
    rows = [x for x in table if re.match(r"  \S", x) and value.search(x)]
    assert len(rows) >= 8, table
    ends = {value.search(x).end(1) for x in rows}
    assert len(ends) == 1, (columns, rows)  # every value ends in the same column
    under = [x for x in table if re.match(r"      \S", x)]  # a source alone under its row
    beside = [x for x in rows if value.search(x).group(0).endswith("   ")]
    assert not (under and beside), table  # sources beside their values or under them, not both


@pytest.mark.parametrize("columns", [60, 80])
@pytest.mark.parametrize("log", ["trtllm_c009", "trtllm_c013", "lmdeploy_c003", "sglang_c009", "vllm_c043"])
def test_headline_is_whole_in_json_and_cut_at_a_word_in_text(columns, log):
    """Item 31: the JSON headline is never ellipsised; the text's first line never ends on a bare label or inside
    brackets, and its lines fit."""
    import json

    path = FIXTURES / "corpus" / f"{log}.log"
    _, js = at(columns, "explain", path, "-f", "json")
    whole = json.loads("\n".join(js))["headline"]
    assert not whole.endswith("...") and " ... " not in whole, whole
    _, lines = at(columns, "explain", path)
    first = lines[0]
    assert not first.endswith(":") and first.count("(") == first.count(")"), first
    assert not [x for x in lines if cell_len(x) > columns]
    assert whole.startswith(first)


def test_capture_replay_is_named_as_a_capture_of_its_host():
    """Item 32: not "kvaudit check local": the capture's directory, its host and when it was taken."""
    _, lines = at(80, "check", KIMI_HOST)
    head = " ".join(" ".join(lines[:6]).split())
    assert "kvaudit check local" not in head
    assert "a capture of gpu-node-07, taken 2026-11-29T07:58:33+00:00" in head, head


def test_small_display_items():
    """Items 33/34: no "cannot check: cannot check", "-0.00", "1740" or "0.8.0..0.11.99" on the page."""
    _, vllm = at(80, "explain", FIXTURES / "corpus" / "vllm_c043.log")
    assert "cannot check:" not in "\n".join(vllm)
    _, trt = at(80, "explain", FIXTURES / "corpus" / "trtllm_c014.log")
    assert "-0.00" not in "\n".join(trt)
    _, lmd = at(80, "explain", FIXTURES / "corpus" / "lmdeploy_c003.log")
    text = " ".join(" ".join(lmd).split())
    assert "blocks 1,740 " in text and "0.11.99" not in text and "0.8.0 to 0.11.x" in text, text[:400]


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_gpu_memory_gib_shows_what_went_before_t(fmt):
    """Item 5: --gpu-memory-gib itemises what went before T; text and Markdown show it, not only JSON."""
    args = ("explain", FIXTURES / "corpus" / "sglang_c002.log", "--gpu-memory-gib", "24")
    _, lines = at(80, *args, *(("-f", "markdown") if fmt == "markdown" else ()))
    text = "\n".join(lines)
    assert "before T" in text
    row = next(x for x in lines if x.lstrip("| ").startswith("TP0"))
    assert "1.09" in row.split() and "22.91" in row.split(), row  # 24 - 22.91 on TP0
    _, plain = at(80, *args[:2])
    assert "before T" not in "\n".join(plain)  # without the card's total: no such column


@pytest.mark.parametrize("log", ["sglang_c014", "sglang_c026", "trtllm_c013", "vllm_c016"])
def test_no_line_passes_60_columns(log):
    """A headline cut to three lines keeps room for its " ..." (sglang_c014's quoted path), and the "Not
    interpreted" heading wraps (sglang_c026)."""
    _, lines = at(60, "explain", FIXTURES / "corpus" / f"{log}.log")
    assert lines and not [x for x in lines if cell_len(x) > 60]


def test_repeated_wording_is_said_once():
    """Item 33: sglang_c002's mismatch sentence is not printed again in In short (it points to the finding that
    says it), "request table 0.00" is left out of the sum, and sglang_c044's platform is not two brackets."""
    _, lines = at(80, "explain", FIXTURES / "corpus" / "sglang_c002.log")
    text = " ".join(" ".join(lines).split())
    short = text.split("In short", 1)[1]
    assert "does not follow from the formula (TOKENS_MISMATCH, under Needs attention)" in short
    assert short.count("implies mem_fraction_static") == 1 and "request table 0.00" not in short, short
    _, c044 = at(80, "explain", FIXTURES / "corpus" / "sglang_c044.log")
    head = " ".join(" ".join(c044[:8]).split())
    assert "reading) (unified memory)" not in head and "unified memory, on a device" in head, head
