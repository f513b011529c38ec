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
