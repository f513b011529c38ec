"""A model config that is not UTF-8 text (ux-audit item 34) is refused in plain words, not Python's codec message."""

from __future__ import annotations

from tests.conftest import FIXTURES, cli


def test_a_binary_model_config_is_named_not_utf8(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"{\xcd\xff\x00")
    r = cli("explain", FIXTURES / "corpus" / "sglang_c002.log", "--model-config", junk)
    assert r.code == 2
    assert "not a UTF-8 text file" in r.stderr and "offset 1" in r.stderr, r.stderr
    assert "codec" not in r.stderr and "Traceback" not in r.stderr


def test_a_card_total_below_t_books_nothing_before_t_and_says_why():
    """ux audit item 5: --gpu-memory-gib 20 on sglang_c002 (T 22.91 GiB) booked -2.91 GiB of 'CUDA context'."""
    from tests.conftest import FIXTURES, cli

    doc = cli("explain", FIXTURES / "corpus" / "sglang_c002.log", "--gpu-memory-gib", "20", "-f", "json").json()
    items = [i for r in doc["ranks"] for i in r["items"] if i["key"] == "before_t"]
    assert items == [] and any("--gpu-memory-gib 20 is below what was free" in n for n in doc["notes"])
    ok = cli("explain", FIXTURES / "corpus" / "sglang_c002.log", "--gpu-memory-gib", "24", "-f", "json").json()
    assert all(i["gib"] > 0 for r in ok["ranks"] for i in r["items"] if i["key"] == "before_t")


def test_plan_names_its_positional_model_argument():
    from tests.conftest import cli

    r = cli("plan", "/nonexistent", "--engine", "sglang==0.5.9", "--gpu", "h100")
    assert r.code == 2 and "MODEL /nonexistent: no such file" in r.stderr and "--model" not in r.stderr
