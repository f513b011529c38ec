"""Shared test helpers: fixture paths, the real CLI in-process and as a subprocess, golden files."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvaudit.cli import Environment, run

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
SAMPLES = FIXTURES / "samples"
CONFIGS = FIXTURES / "configs"
KIMI_LOG = FIXTURES / "journal_logs" / "kimi-k25-sglang-0.5.9-tp8-eagle3.log"
KIMI_CONFIG = CONFIGS / "kimi-k2.5.json"

# the suite never reads the developer's own ~/.config/kvaudit/kvaudit.toml (kvaudit.fleet.settings): every test,
# in-process or a subprocess, sees an empty user config directory
import tempfile as _tempfile  # noqa: E402

os.environ["XDG_CONFIG_HOME"] = _tempfile.mkdtemp(prefix="kvaudit-test-xdg-")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


def cli(*args: str, stdin: bytes = b"") -> Result:
    """The CLI in-process, with an injected environment (no TTY, no colour)."""
    out, err = io.StringIO(), io.StringIO()
    env = Environment(stdin=io.BytesIO(stdin), stdout=out, stderr=err, stdout_isatty=False, stderr_isatty=False,
                      environ={"NO_COLOR": "1"})
    code = run([str(a) for a in args], env)
    return Result(code, out.getvalue(), err.getvalue())


def cli_process(*args: str, stdin: bytes | None = None, timeout: float = 120) -> Result:
    """The installed console script, as a user runs it."""
    exe = Path(sys.executable).with_name("kvaudit")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "kvaudit"]
    env = {k: v for k, v in os.environ.items() if k != "KVAUDIT_DEBUG"}
    p = subprocess.run(cmd + [str(a) for a in args], input=stdin, capture_output=True, timeout=timeout, env=env)
    return Result(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def cli_limited(*args: str, address_space: int, timeout: float = 120) -> tuple[int, str]:
    """The installed CLI with its address space capped: a path that grows memory without bound fails
    (MemoryError, exit 70) instead of passing unnoticed. Returns (exit code, stderr)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    exe = Path(sys.executable).with_name("kvaudit")
    # few malloc arenas: each thread's arena reserves address space it never uses, which would make the cap
    # depend on thread timing rather than on what the code keeps
    env = {**{k: v for k, v in os.environ.items() if k != "KVAUDIT_DEBUG"}, "MALLOC_ARENA_MAX": "2"}
    p = subprocess.run([str(exe), *map(str, args)], capture_output=True, timeout=timeout, env=env, preexec_fn=limit)
    return p.returncode, p.stderr.decode("utf-8", "replace")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        assert text.strip(), f"refusing an empty output for golden file {name}"
        path = FIXTURES / "golden" / name
        if update or not path.exists():
            if not update:
                pytest.fail(f"golden file {path} is missing; run 'make golden' and review the diff")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        assert text == path.read_text(encoding="utf-8"), f"output differs from {path} (make golden to accept)"

    return check


def openpty() -> tuple[int, int]:
    """A pseudo-terminal (master, slave); the test is skipped where the machine has none to give (a chroot or a
    container without /dev/pts: 'out of pty devices')."""
    import pty

    try:
        return pty.openpty()
    except OSError as exc:
        pytest.skip(f"no pseudo-terminal on this machine: {exc}")
