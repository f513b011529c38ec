"""Reports fit the terminal they are read on (issue 38, item 1): on a pseudo-terminal of 80 and of 120 columns, and
piped from a command started on such a terminal (the controlling terminal's width, as gpustat, nvitop and kubectl
take it), no line of `explain`, `check`, `fleet`, `whatif` or `plan` is wider than the terminal, and the headline is
one line. Without a terminal at all the width is 80. The real CLI in a real pseudo-terminal (no $COLUMNS)."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, cli, openpty

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"
EXE = Path(sys.executable).with_name("kvaudit")
ENV = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")} | {"NO_COLOR": "1"}


def _terminal(columns: int) -> tuple[int, int]:
    master, slave = openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    return master, slave


def _drain(master: int) -> bytes:
    chunks = []
    while True:
        try:
            block = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not block:
            break
        chunks.append(block)
    return b"".join(chunks)


def on_a_terminal(columns: int, *args) -> list[str]:
    """What the CLI printed with its stdout a terminal of ``columns`` columns."""
    master, slave = _terminal(columns)
    p = subprocess.Popen([str(EXE), *map(str, args)], stdout=slave, stderr=subprocess.DEVNULL, env=ENV)
    os.close(slave)
    out = _drain(master)
    os.close(master)
    assert p.wait(timeout=180) in (0, 1, 3), out[-500:]
    return out.decode().replace("\r\n", "\n").splitlines()


def piped_from_a_terminal(columns: int, *args) -> list[str]:
    """What the CLI printed into a pipe, started from a terminal of ``columns`` columns (its controlling terminal:
    a new session that opens the pseudo-terminal, as a shell's job does)."""
    master, slave = _terminal(columns)
    name = os.ttyname(slave)

    def own_terminal() -> None:
        os.setsid()
        fd = os.open(name, os.O_RDWR)  # the session's first terminal becomes its controlling terminal
        os.dup2(fd, 0)

    p = subprocess.run([str(EXE), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ENV,
                       preexec_fn=own_terminal, timeout=180)
    os.close(slave)
    os.close(master)
    assert p.returncode in (0, 1, 3), p.returncode
    return p.stdout.decode().splitlines()


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("width")
    inv = root / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n")
    history = root / "history.db"
    assert cli("fleet", inv, "--history", history).code == 0
    return {
        "explain": ("explain", KIMI_LOG, "-m", KIMI_CONFIG),
        "explain (a mismatch)": ("explain", FIXTURES / "samples" / "sglang_212.log"),
        "check": ("check", KIMI_HOST),
        "fleet": ("fleet", inv, "--no-config"),
        "whatif": ("whatif", KIMI_LOG, "-m", KIMI_CONFIG, "--mem-fraction-static", "0.92"),
        "plan": ("plan", KIMI_CONFIG, "--engine", "sglang==0.5.9", "--gpu", "rtx-pro-6000", "--tp", "8",
                 "--fraction", "0.9", "--history", history),
    }


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("name", ["explain", "explain (a mismatch)", "check", "fleet", "whatif", "plan"])
def test_every_report_fits_its_terminal(commands, name, columns):
    args = commands[name]
    for how, lines in (("terminal", on_a_terminal(columns, *args)), ("pipe", piped_from_a_terminal(columns, *args))):
        assert lines, (name, how)
        wide = [x for x in lines if cell_len(x) > columns]
        assert not wide, (name, how, columns, wide[:3])
        if name != "plan":  # the headline: one line, its detail indented under it
            assert lines[0].split()[0].isupper() or lines[0].startswith(("kvaudit fleet", "What if")), lines[0]


def test_without_a_terminal_the_width_is_80(commands):
    """No terminal anywhere (cron, CI, a service): 80 columns, the old fixed 100 and 120 no more."""
    for name in ("explain (a mismatch)", "check", "fleet"):
        p = subprocess.run([str(EXE), *map(str, commands[name])], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, env=ENV, start_new_session=True, timeout=180)
        lines = p.stdout.decode().splitlines()
        assert lines and max(cell_len(x) for x in lines) <= 80, (name, [x for x in lines if cell_len(x) > 80][:3])
