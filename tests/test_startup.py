"""What start-up loads (issues 23 and 40): the version without the CLI, a log with its own engine's formula only,
an SSH check without paramiko's optional ``invoke``, a capture without paramiko. Asserted as modules loaded, never as
time (the bench measures the time: `make bench`, bench/startup.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, SAMPLES

PROBE = """
import io, json, sys
argv = sys.argv[1:]
sys.argv = ["kvaudit", *argv]
from kvaudit.main import main
out = io.StringIO()
real, sys.stdout = sys.stdout, out
try:
    main()
except SystemExit:
    pass
sys.stdout = real
print(json.dumps({"out": out.getvalue()[:200], "modules": sorted(m for m in sys.modules
                  if m.split(".")[0] in ("kvaudit", "typer", "pydantic", "rich", "paramiko", "invoke", "markdown_it",
                                         "pygments", "unittest", "asyncio"))}))
"""


def _loaded(*argv: str) -> tuple[str, set[str]]:
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return doc["out"], set(doc["modules"])


def test_version_loads_neither_the_cli_nor_the_engines():
    out, mods = _loaded("--version")
    assert out.startswith("kvaudit ")
    assert not {"typer", "pydantic", "kvaudit.cli", "kvaudit.engines"} & mods


def test_a_log_loads_only_its_own_engines_formula():
    out, mods = _loaded("explain", str(SAMPLES / "sglang_029.log"), "--format", "json")
    assert out.lstrip().startswith(("{", "[")), out  # the report was written (its content is tested elsewhere)
    assert "kvaudit.reconcile.sglang.audit" in mods
    assert not {m for m in mods if m.startswith(("kvaudit.reconcile.vllm", "kvaudit.reconcile.trtllm",
                                                  "kvaudit.reconcile.lmdeploy"))}
    assert "kvaudit.ignores" not in mods  # nothing acknowledged: no rules to read


def test_an_ascii_text_report_loads_no_rich():
    """report.text measures printable ASCII itself; rich.cells only for other characters (the same widths)."""
    out, mods = _loaded("explain", str(SAMPLES / "sglang_029.log"))
    assert "Formula" in out or "MATCH" in out or out.startswith("OK"), out
    assert not {m for m in mods if m.split(".")[0] == "rich"}


@pytest.mark.parametrize("log, engine", [("sglang_029.log", "sglang"), ("vllm_001.log", "vllm")])
def test_a_log_loads_only_its_own_engines_grammar(log, engine):
    """The engine is told from the words (kvaudit.parse.vocabulary); only its grammar is imported (issue 40)."""
    out, mods = _loaded("explain", str(SAMPLES / log), "--format", "json")
    assert out.lstrip().startswith(("{", "[")), out
    grammars = {"kvaudit.parse.sglang", "kvaudit.parse.vllm", "kvaudit.parse.trtllm", "kvaudit.parse.lmdeploy"}
    assert grammars & mods == {f"kvaudit.parse.{engine}"}
    formulas = {m.split(".")[2] for m in mods if m.startswith("kvaudit.reconcile.") and m.count(".") >= 2}
    assert formulas & {"sglang", "vllm", "trtllm", "lmdeploy"} == {engine}
    # a log's audit is judged without the host and fleet results, nor the collectors they hold
    assert not {"kvaudit.results", "kvaudit.collect.interface", "kvaudit.reconcile.live"} & mods


@pytest.mark.skipif(shutil.which("ssh") is None, reason="without OpenSSH's client, paramiko reads ssh_config itself "
                    "and invoke is loaded for its Match exec, as before")
def test_an_ssh_check_loads_paramiko_without_invoke(tmp_path):
    """paramiko.config imports ``invoke`` (unittest.mock, asyncio, a vendored yaml) only for ssh_config's
    ``Match exec``: kvaudit keeps it out; the check still goes as far as the connection (refused here)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: the connection is refused
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host refused\n  HostName 127.0.0.1\n  Port {port}\n  User nobody\n")
    _, mods = _loaded("check", "refused", "--ssh-config", str(cfg), "--timeout", "10", "--format", "json")
    assert "paramiko.transport" in mods  # it did connect (or try to)
    assert not {m for m in mods if m.split(".")[0] in ("invoke", "unittest", "asyncio")}
    assert not {"kvaudit.collect.endpoint", "kvaudit.collect.kube"} & mods  # neither is this target's collector


def test_a_capture_loads_no_ssh_library():
    out, mods = _loaded("check", str(FIXTURES / "hosts" / "kimi-k25-tp8"), "--format", "json")
    assert out.lstrip().startswith("{"), out
    assert not {m for m in mods if m.split(".")[0] in ("paramiko", "invoke")}
    assert not {"kvaudit.collect.endpoint", "kvaudit.collect.kube"} & mods


def test_help_loads_neither_markdown_nor_pygments():
    """typer.rich_utils imports rich.markdown and rich.traceback for markdown markup and pretty tracebacks, which
    kvaudit does not use: --help renders with stand-ins for them (the help itself: tests/test_cli.py)."""
    out, mods = _loaded("--help")
    assert "Usage" in out and "typer.rich_utils" in mods
    assert not {m for m in mods if m.split(".")[0] in ("markdown_it", "pygments")}
    assert not {"rich.markdown", "rich.traceback"} & mods


def test_a_command_is_built_alone_with_the_same_parameters():
    """typer builds only the invoked command's click parameters (issue 40): the same parameters, defaults and help
    as in the whole group; the root's --help builds each command without its parameters, an unknown command word
    builds them all (for click's error)."""
    import typer

    from kvaudit.cli import _invoked, app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, full in group.commands.items():
        alone = typer.main.get_command(_invoked([name, "x", "--format", "json"]))
        assert isinstance(alone, typer.core.TyperGroup) and list(alone.commands) == [name]
        one = alone.commands[name]
        assert [(p.name, p.opts, p.default, getattr(p, "help", None)) for p in one.params] == \
            [(p.name, p.opts, p.default, getattr(p, "help", None)) for p in full.params]
        assert one.help == full.help
    assert _invoked(["nosuch"]) is app  # an unknown command: click's error names the commands there are
    for argv in ([], ["--help"], ["--version"]):  # the root's help lists each command by its name and help
        listed = typer.main.get_command(_invoked(argv))
        assert isinstance(listed, typer.core.TyperGroup) and list(listed.commands) == list(group.commands)
        for name, full in group.commands.items():
            shown = listed.commands[name]
            assert (shown.help, shown.short_help, shown.hidden, shown.rich_help_panel) == \
                (full.help, full.short_help, full.hidden, full.rich_help_panel)
