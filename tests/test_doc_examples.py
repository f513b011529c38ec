"""Every `kvaudit ...` example in the README and docs/ is a command line the CLI accepts: each is parsed by the
real command (options, choices, types), so a renamed flag or a stale example fails here (issue 11, item 17).
Examples that name a bundled file are also run."""

from __future__ import annotations

import re
import shlex

import pytest
import typer

from kvaudit.cli import app
from tests.conftest import ROOT, cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _examples() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        in_code, pending = False, ""
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                continue
            text = pending + line.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            text = re.sub(r"^\$ ", "", text)
            if text.startswith("kvaudit "):
                out.append((f"{doc.name}:{n}", text))
    return out


EXAMPLES = _examples()


def _argv(text: str) -> list[str]:
    text = re.split(r"\s+#\s", text)[0]  # a trailing comment
    text = re.split(r"\s(?:\||>|\|\||&&|;)\s", text)[0]  # a pipe, a redirection, a second command
    return shlex.split(text)[1:]


def test_there_are_examples():
    assert len(EXAMPLES) >= 25


@pytest.mark.parametrize("where, text", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_example_parses(where, text):
    argv = _argv(text)
    group = typer.main.get_command(app)
    sub = group.commands[argv[0]]
    ctx = sub.make_context(argv[0], argv[1:])  # raises on an unknown option, a bad choice or type
    assert ctx.params is not None


def test_the_makefile_examples_run():
    """`make demo` and `make explain-demo`, as the README promises them, on the bundled files."""
    make = (ROOT / "Makefile").read_text()
    host = re.search(r"^KIMI_HOST := (\S+)", make, re.M).group(1)
    for target in ("demo", "explain-demo"):
        recipe = re.search(rf"^{target}:.*\n\t(.+)$", make, re.M).group(1)
        argv = shlex.split(recipe.replace("$(BIN)/kvaudit", "kvaudit").replace("$(KIMI_HOST)", host))[1:]
        r = cli(*[str(ROOT / a) if (ROOT / a).exists() else a for a in argv])
        assert r.code == 0, (target, r.stderr)
        assert "159,277" in r.stdout and "MATCH" in r.stdout
