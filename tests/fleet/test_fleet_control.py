"""Fleet as the person running it needs: Ctrl-C stops it and keeps what finished, a bad output path fails
before any host is contacted, the run deadline ends the process, and a write that fails at the end loses
nothing else (issue 11, items 1-3). Servers are live endpoints on loopback: some answer, some accept the
connection and never answer."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tests.endpointsim import json_doc, serve, sglang_server_info

KIMI_INFO = sglang_server_info({"mem_fraction_static": 0.88, "tp_size": 8, "page_size": 1},
                               [{"weight": 72.3, "kvcache": 10.42, "token_capacity": 159277}], "0.5.9")


@contextmanager
def silent_server():
    """Accepts connections and reads the request, never answers. ``arrived`` is set when a request came in."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    arrived = threading.Event()
    held: list[socket.socket] = []

    def loop():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            held.append(conn)
            arrived.set()

    threading.Thread(target=loop, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", arrived
    finally:
        sock.close()
        for c in held:
            c.close()


def _kvaudit(*args: str) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("kvaudit")
    return subprocess.Popen([str(exe), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_keeps_what_finished_and_exits_130(tmp_path):
    with serve({"/server_info": json_doc(KIMI_INFO)}) as (fast, _), silent_server() as (slow, arrived):
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{fast}\n{fast}/a\n{slow}\n{slow}/b\n")
        p = _kvaudit("fleet", inv, "--parallel", "1", "--timeout", "60", "-f", "json")
        # one worker, in order: the silent server is reached only after both fast hosts finished
        assert arrived.wait(60)
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        stopped_in = time.monotonic() - t
    assert p.returncode == 130, err
    hosts = json.loads(out)["hosts"]
    assert "Traceback" not in err and "interrupted: 2 of 4 hosts finished" in err, [h["summary"] for h in hosts]
    assert [h["summary"]["status"] for h in hosts] == ["partial", "partial", "failed:interrupted",
                                                       "failed:interrupted"]
    assert stopped_in < 10, stopped_in  # not the 60 s host timeout


def test_a_second_ctrl_c_never_prints_a_traceback(tmp_path):
    with silent_server() as (slow, arrived):
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{slow}\n")
        p = _kvaudit("fleet", inv, "--timeout", "60")
        assert arrived.wait(60)
        p.send_signal(signal.SIGINT)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "Traceback" not in err


def test_the_run_deadline_ends_the_process(tmp_path):
    """Workers stuck on servers that never answer (a 60 s host timeout): the process exits at the 3 s run
    deadline, every stuck host reported as timed out."""
    with silent_server() as (slow, arrived):
        inv = tmp_path / "servers.txt"
        inv.write_text("".join(f"{slow}/{i}\n" for i in range(3)))
        t = time.monotonic()
        p = _kvaudit("fleet", inv, "--timeout", "60", "--run-timeout", "3", "-f", "json")
        out, err = p.communicate(timeout=50)
        took = time.monotonic() - t
    assert p.returncode == 4, err
    assert [h["summary"]["reason"] for h in json.loads(out)["hosts"]] == ["timeout"] * 3
    assert took < 40, took  # far below the 60 s the stuck workers would take


def test_bad_outputs_fail_before_any_host_is_contacted(tmp_path):
    with serve({"/server_info": json_doc(KIMI_INFO)}) as (url, seen):
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{url}\n")
        (tmp_path / "not-sqlite").write_text("my notes\n")
        for extra, says in ((["--textfile-dir", tmp_path / "typo"], "no such directory"),
                            (["-o", tmp_path / "missing" / "r.json"], "does not exist"),
                            (["--html", tmp_path], "is a directory"),
                            (["--history", tmp_path / "not-sqlite"], "not a SQLite file"),
                            (["--parquet"], "--parquet writes --csv"),
                            (["--ssh-config", tmp_path / "nope"], "--ssh-config")):
            p = _kvaudit("fleet", inv, *extra)
            out, err = p.communicate(timeout=60)
            assert p.returncode == 2 and says in err and err.count("\n") == 1, (extra, err)
        assert seen == []


def test_a_write_failing_at_the_end_loses_nothing_else(tmp_path):
    """--html to /dev/full passes every check before the run (it is writable) and fails when written: the
    JSON report and the CSV are still written and the exit status is the fleet's, not 2."""
    with serve({"/server_info": json_doc(KIMI_INFO)}) as (url, _):
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{url}\n")
        p = _kvaudit("fleet", inv, "--html", "/dev/full", "--csv", tmp_path / "gpus.csv", "-f", "json")
        out, err = p.communicate(timeout=60)
    assert p.returncode == 6, err  # partial (an endpoint has no GPU readings), as without the failed write
    assert "could not write --html /dev/full" in err
    assert json.loads(out)["hosts"][0]["summary"]["tokens"] == 159277
    assert (tmp_path / "gpus.csv").read_text().startswith("run_at,host,")


def _with_stderr_on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """The CLI in-process with an injected environment whose stderr is a terminal and stdout a pipe (httpie's
    pattern: no pseudo-terminal needed, so it runs where /dev/pts is missing, as in a fresh chroot)."""
    import io

    from kvaudit.cli import Environment, run

    out, err = io.StringIO(), io.StringIO()
    code = run([str(a) for a in args], Environment(stdin=io.BytesIO(), stdout=out, stderr=err, stdout_isatty=False,
                                                   stderr_isatty=True, environ={}))
    return code, out.getvalue(), err.getvalue()


def test_progress_on_a_terminal_only_and_cleared_before_the_report(tmp_path):
    with serve({"/server_info": json_doc(KIMI_INFO)}) as (fast, _), silent_server() as (slow, _):
        inv = tmp_path / "servers.txt"
        inv.write_text(f"{fast}\n{fast}/b\n{slow}\n")
        code, out, term = _with_stderr_on_a_terminal(["fleet", inv, "--timeout", "3", "-f", "json"])
        assert code == 4 and json.loads(out)["run"]["hosts"] == 3  # stdout: the report alone
        assert "kvaudit fleet" in term and "3/3" in term and "1 failed" in term  # done/total, failures
        assert term.rstrip().endswith("\x1b[2K") or "\x1b[2K" in term[-40:]  # the line cleared at the end
        quiet_code, _, quiet_term = _with_stderr_on_a_terminal(["fleet", inv, "--timeout", "3", "-q", "-f", "json"])
        assert quiet_code == 4 and "kvaudit fleet" not in quiet_term
        p = _kvaudit("fleet", inv, "--timeout", "3", "-f", "json")  # stderr a pipe (cron): no progress
        _, err = p.communicate(timeout=60)
        assert "kvaudit fleet" not in err and "\x1b[" not in err
