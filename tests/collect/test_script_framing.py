"""The host script's framing is read with one compiled pattern for every host (issue 40): each part's begin and
end markers hold the host's nonce, found with ``bytes.find``, where two patterns were compiled per host. The
parts come out as ``finditer``/``search`` of the nonce's own patterns found them, on framings built from random
pieces (markers of this nonce and another, torn headers, statuses out of range, stray newlines and tabs)."""

from __future__ import annotations

import re
import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from kvaudit.collect.interface import CommandResult
from kvaudit.collect.session import ScriptPart, script_parts

NONCE, OTHER = b"0123456789abcdef", b"fedcba9876543210"
PIECES = [b"\n@@" + n + w for n in (NONCE, OTHER) for w in (b" begin", b" begin\n", b" end ", b" end\n")] + [
    b"\tjournal", b"\tconfig\t/x/config.json", b"\t", b"\n", b"0\n", b"1", b"255\n", b"1000\n", b"text", b"@@",
    b" begin", b" end ", b"\x00\xff",
]


def _by_pattern(res: CommandResult, nonce: bytes) -> list[ScriptPart]:
    """The same reading with the nonce's own two patterns, as kvaudit did before."""
    begin = re.compile(rb"\n@@" + nonce + rb" begin((?:\t[^\t\n]*)*)\n")
    end = re.compile(rb"\n@@" + nonce + rb" end (\d{1,3})\n")
    err_begin, err_end = b"\n@@" + nonce + b" begin\n", b"\n@@" + nonce + b" end\n"
    errs, at = [], 0
    while (i := res.stderr.find(err_begin, at)) >= 0:
        j = res.stderr.find(err_end, i + len(err_begin))
        if j < 0:
            break
        errs.append(res.stderr[i + len(err_begin):j])
        at = j + len(err_end)
    heads = list(begin.finditer(res.stdout))
    parts: list[ScriptPart] = []
    each = res.seconds / max(1, len(heads))
    timed_out = res.rc is None and b"[kvaudit: timed out]" in res.stderr
    for n, head in enumerate(heads):
        words = head.group(1).decode("utf-8", "surrogateescape").split("\t")[1:]
        kind, args = (words[0], tuple(words[1:])) if words else ("", ())
        stop = heads[n + 1].start() if n + 1 < len(heads) else len(res.stdout)
        closing = end.search(res.stdout, head.end(), stop + 1)
        if closing is None or n >= len(errs):
            if timed_out and n == len(heads) - 1:
                parts.append(ScriptPart(kind, args, None, res.stdout[head.end():], b"[kvaudit: timed out]", each))
            break
        parts.append(ScriptPart(kind, args, int(closing.group(1)), res.stdout[head.end():closing.start()],
                                errs[n], each))
    return parts


framing = st.lists(st.sampled_from(PIECES), max_size=40).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(framing, framing, st.sampled_from([0, None]))
def test_the_parts_are_those_the_nonces_own_patterns_find(stdout, stderr, rc):
    res = CommandResult("script", rc, stdout, stderr + (b"[kvaudit: timed out]" if rc is None else b""), 1.0)
    assert script_parts(res, NONCE) == _by_pattern(res, NONCE)


def test_a_whole_framing_gives_each_part_and_another_nonces_markers_are_output():
    out = (b"\n@@" + NONCE + b" begin\tjournal\tunit\nline one\n@@" + OTHER + b" end 0\n\n@@" + NONCE + b" end 0\n"
           b"\n@@" + NONCE + b" begin\tnvidia-smi\n80,1\n\n@@" + NONCE + b" end 9\n")
    err = b"\n@@" + NONCE + b" begin\n\n@@" + NONCE + b" end\n\n@@" + NONCE + b" begin\nwarn\n@@" + NONCE + b" end\n"
    parts = script_parts(CommandResult("script", 0, out, err, 2.0), NONCE)
    assert [(p.kind, p.args, p.rc, p.stderr) for p in parts] == [("journal", ("unit",), 0, b""),
                                                                ("nvidia-smi", (), 9, b"warn")]
    assert parts[0].stdout == b"line one\n@@" + OTHER + b" end 0\n"  # a hostile line holding another nonce is data
    assert parts == _by_pattern(CommandResult("script", 0, out, err, 2.0), NONCE)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), min_size=6, max_size=6), st.lists(st.text(max_size=8), max_size=3),
       st.lists(st.binary(max_size=10), max_size=5), st.booleans())
def test_the_commands_are_the_shell_words_quoted_one_by_one(words, fragments, anchors, windowed):
    """host_script and journal_lines quote the window and anchors once per process: the command is still each
    word shell-quoted, in order (shlex.join of the whole argv)."""
    from kvaudit.collect import commands as C

    window = C.StartupWindow(markers=((0, "SGLang"),), ready=((0, "ready"),)) if windowed else None
    nonce, kind, unit, directory, source, model = words
    anchor_words = [a.decode("latin-1") for a in anchors]
    got = C.host_script(nonce, kind, unit, directory, source, model, 7, tuple(fragments), tuple(anchors), 9, window)
    argv = ["sh", "-c", C.HOST_SCRIPT, "sh", nonce, kind, unit, directory, source, model, "7", str(len(fragments)),
            *fragments, "9", *(window or C.StartupWindow()).args, *anchor_words]
    assert got == shlex.join(argv)
    if window is not None:
        got = C.journal_lines(unit, "abc", directory or None, tuple(anchors), window)
        assert got == shlex.join(["sh", "-c", C.JOURNAL_WINDOW_SCRIPT, "sh", directory or "",
                                  "_SYSTEMD_INVOCATION_ID=abc", *window.args, *anchor_words])


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab _-./@%+=:,'\"\\|$`;é\t"), max_size=6), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(0, 60), st.sampled_from(" '\"\\|ab$")), max_size=3))
def test_a_stage_is_read_as_shlex_reads_it_when_it_is_written_as_shlex_joins(argv, edits):
    """The command gate reads each stage's words with one regex where it used shlex.split: for every stage
    shlex.join writes, the same words; for any other string (a joined one with characters inserted), the same
    verdict on whether it is one shlex.join would write."""
    from kvaudit.collect.commands import _joined_words

    stage = shlex.join(argv)
    assert _joined_words(stage) == shlex.split(stage) == argv
    for at, ch in edits:
        stage = stage[:at] + ch + stage[at:]
    fast = _joined_words(stage)
    try:
        slow: list[str] | None = shlex.split(stage)
    except ValueError:
        slow = None
    canonical = slow is not None and shlex.join(slow) == stage
    assert (fast is not None and shlex.join(fast) == stage) == canonical
    if canonical:
        assert fast == slow
