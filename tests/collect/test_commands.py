"""The read-only command list: quoting of hostile input, and the allow-list gate."""

from __future__ import annotations

import shlex

import pytest

from kvaudit.collect import commands as C
from kvaudit.engines import all_anchors, startup_window

HOSTILE = ["sglang server; rm -rf /", "$(reboot)", "`id`", "a' || touch /tmp/x '", "x\nrm -rf /", "--vacuum-size=1"]


@pytest.mark.parametrize("name", HOSTILE)
def test_user_input_reaches_the_host_as_one_literal_argument(name):
    for cmd in (C.invocation_id(name), C.control_group(name), C.read_config(name), C.docker_started(name)):
        argv = shlex.split(cmd)
        assert argv[-1] == name and argv[-2] == "--", cmd  # a positional after --: never an option
        assert C.is_allowed(cmd)
    for cmd in (C.last_invocation_in_journal(name, None), C.journal_lines(name, None, None, all_anchors())):
        first = cmd.split(" | ")[0]
        assert f"--unit={name}" in shlex.split(first), cmd  # bound to --unit, never parsed as an option
        if "\n" not in name:
            assert C.is_allowed(cmd)
    hf = C.hf_snapshots(name.replace(" ", "_"))
    assert shlex.split(hf)[2] == C.HF_SNAPSHOT_SCRIPT  # the script is a constant; input is only $1


def test_every_builder_passes_the_gate():
    a = all_anchors()
    for cmd in (C.list_units(), C.journal_units(None), C.journal_units("/var/log/journal"), C.invocation_id("u"),
                C.control_group("u"), C.cgroup_pids("/system.slice/u.service"), C.last_invocation_in_journal("u", None),
                C.journal_lines("u", "b" * 32, None, a), C.journal_lines("u", None, "/j", a),
                C.journal_lines("u", "b" * 32, "/j", a, startup_window()), C.journal_lines("u", "b" * 32, None, a,
                                                                                          startup_window()),
                C.docker_started("c"), C.docker_lines("c", "2026-01-01T00:00:00Z", a), C.file_lines("/f", a),
                C.query_gpus(), C.query_apps(), C.read_config("/m/config.json"), C.hf_snapshots("org/name"),
                C.hostname()):
        assert C.is_allowed(cmd), cmd


@pytest.mark.parametrize("cmd", [
    "rm -rf /", "journalctl --vacuum-size=1M", "journalctl --rotate", "systemctl restart sglang",
    "systemctl stop sglang.service", "nvidia-smi -r", "nvidia-smi --gpu-reset", "docker rm x", "docker exec x sh",
    "sh -c 'touch /x'", "grep x /etc/passwd > /tmp/out", "cat /etc/shadow", "journalctl -u x | tee /tmp/y",
    "hostname newname; reboot", "hostname newname", "python3 -c 1", "grep $(reboot) /f", "grep x /f; reboot",
    "journalctl -u x && reboot", "grep x /f > /etc/passwd", "nvidia-smi `reboot`",
])
def test_the_gate_refuses_anything_else(cmd):
    assert not C.is_allowed(cmd)


def test_batched_commands_keep_their_own_output_and_status():
    from kvaudit.collect.local import LocalRunner
    from kvaudit.collect.ssh import run_batch

    class Once(LocalRunner):
        calls = 0

        def run(self, command, timeout, max_bytes):
            Once.calls += 1
            return super().run(command, timeout, max_bytes)

    out = run_batch(Once(), ["echo one", "sh -c 'echo oops >&2; exit 3'", "printf '@@fake 0 end 0\\n'"], 10, 1000)
    assert Once.calls == 1  # one round trip
    assert [(r.rc, r.stdout) for r in out] == [(0, b"one\n"), (3, b"oops\n"), (0, b"@@fake 0 end 0\n")]


@pytest.mark.parametrize("cmd", [
    "journalctl --vac=1M",  # abbreviated --vacuum-size: journalctl accepts unique prefixes
    "journalctl --no-pager --rot",
    "journalctl --no-pager --cursor-file=/tmp/c -o cat",
    "journalctl --no-pager -q --unit=u -o json-pretty",
    "journalctl --no-pager -q -n 1000000 --unit=u",
    "journalctl --no-pager -q --directory relative/dir -F _SYSTEMD_UNIT",
    "nvidia-smi -pm 1",
    "nvidia-smi --query-gpu=index --format=csv",
    "nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.reserved,memory.used,memory.free,"
    "driver_version --format=csv,noheader,nounits -i 0",
    "grep -a -n -F -e x -r /",
    "grep -a -n -F -e x -- /f /etc/shadow",
    "head -c 1 -- /etc/shadow",
    "head -c 4194304 /m/config.json",
    "cut -c 1-10",
    "docker logs --follow -- c",
    "docker inspect -f '{{json .}}' -- c",
    "systemctl show -p Environment --value -- u",
    "systemctl list-units --type=service --all",
    "sh -c 'exit 0'",
])
def test_the_gate_allows_only_the_exact_options_kvaudit_uses(cmd):
    assert not C.is_allowed(cmd)


def test_a_refused_command_is_reported_as_a_refusal(tmp_path):
    from kvaudit.collect.interface import CommandRefused
    from kvaudit.collect.local import LocalRunner
    from kvaudit.collect.session import CollectOptions, HostSession
    from kvaudit.status import ExitStatus, for_error

    session = HostSession(LocalRunner(), "local", CollectOptions(anchors=(b"GiB",)))
    with pytest.raises(CommandRefused, match="read-only list") as err:
        session.run("journalctl --vac=1M")
    assert err.value.reason == "refused_command" and for_error(err.value.reason) == ExitStatus.INTERNAL_ERROR
    assert session.records == []  # nothing ran


def test_a_model_path_holding_a_pipe_is_one_quoted_argument():
    """issue 21: a server_args model_path with ' | ' split the gate's pipeline and was refused as a kvaudit bug
    (exit 70). Stages are split only at pipes outside quotes; a pipe inside a quoted path is data."""
    from kvaudit.collect import commands as C

    for path in ("/models/a | b/config.json", "/m/x|y$(id)/config.json", "/m/'q' | \"r\"/config.json"):
        assert C.is_allowed(C.read_config(path)), path
    assert not C.is_allowed("head -c 4194304 -- /x | sh -c id")  # an unquoted pipe is still a stage, refused
    assert not C.is_allowed("head -c 4194304 -- '/x | y")  # a quote left open


def test_a_unit_or_directory_no_command_can_take_is_the_users_input(tmp_path):
    """A newline in --unit or a relative --journal-directory is refused as bad input (exit 2) before anything
    runs, with what a valid one is: not the gate's 'a bug in kvaudit' (exit 70)."""
    from kvaudit.collect.commands import setting_problem
    from tests.conftest import cli

    assert setting_problem("sglang.service", "/var/log/journal/remote") is None
    assert "unit name" in setting_problem("a\nb", None)
    assert "absolute path" in setting_problem(None, "rel/dir")
    for arg in ("--unit=a\nb", "--journal-directory=rel/dir"):
        r = cli("check", "local", arg)
        assert r.code == 2 and "bad_setting" in r.stderr and "a bug in kvaudit" not in r.stderr, r.stderr


# --- the host script (issue 23: one exec) -------------------------------------------------------------------

def _script(kind="journal", unit=None, directory=None, source=None, model=None, fragments=("sglang", "vllm"),
            anchors=(b"KV Cache is allocated", b"GB")):
    return C.host_script("0123456789abcdef", kind, unit, directory, source, model, 1 << 20, fragments, anchors,
                         window=startup_window())


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_values_reach_the_host_script_as_literal_parameters(name):
    """A unit, a path, a docker name or an anchor the host chose reaches the fixed script as one positional
    parameter: the script text is the constant, the argv after it is exactly the values, in their places."""
    unit = name if "\n" not in name and " " not in name else None
    for kind, kw in (("journal", {"unit": unit}), ("file", {"source": name}), ("docker", {"source": name}),
                     ("none", {"model": name})):
        if (kw.get("source") or kw.get("model") or "").count("\n"):
            continue
        cmd = _script(kind, **kw)
        argv = shlex.split(cmd)
        assert argv[:4] == ["sh", "-c", C.HOST_SCRIPT, "sh"] and argv[5] == kind
        assert argv[6] == (kw.get("unit") or "") and argv[8] == (kw.get("source") or "")
        assert argv[9] == (kw.get("model") or "")
        assert C.is_allowed(cmd), (kind, name)


@pytest.mark.parametrize("change", [
    lambda a: a.__setitem__(2, a[2].replace("exit 0", "rm -rf /; exit 0")),  # the script text is not the constant
    lambda a: a.__setitem__(4, "not-a-nonce"),
    lambda a: a.__setitem__(5, "shell"),  # a kind the script does not have
    lambda a: a.__setitem__(6, "two words"),  # a unit systemd could not name
    lambda a: a.__setitem__(7, "relative/dir"),  # a journal directory (given to a journal kind) must be absolute
    lambda a: a.__setitem__(11, "3"),  # more fragments announced than given
    lambda a: a.__setitem__(12, "Sglang server"),  # a fragment is one lower-case word
    lambda a: a.__setitem__(15, "0"),  # the startup window's tail: a count of lines
    lambda a: a.__setitem__(17, "0\tmarker\\n"),  # a backslash awk's -v would read as an escape
    lambda a: a.__setitem__(18, "sglang\tready"),  # a ready line's engine is its index
])
def test_the_gate_holds_the_host_script_to_its_shape(change):
    argv = shlex.split(_script())
    assert C.is_allowed(shlex.join(argv))
    change(argv)
    assert not C.is_allowed(shlex.join(argv))


def test_the_host_scripts_gate_is_one_parse_for_a_fleet():
    """Each host's script differs only in its nonce: the gate parses it once (a fleet's hosts share it)."""
    first = _script()
    C.is_allowed(first)
    before = C._is_allowed.cache_info().hits
    other = first.replace(" 0123456789abcdef ", " fedcba9876543210 ", 1)
    assert other != first and C.is_allowed(other)
    assert C._is_allowed.cache_info().hits == before + 1


def test_the_host_script_runs_hostile_values_as_data(tmp_path):
    """Run for real: a file path, a docker name and a model path made of shell syntax are read as names (and not
    found); nothing is created, and every part still comes back framed."""
    from kvaudit.collect.local import LocalRunner
    from kvaudit.collect.session import script_parts

    marker = tmp_path / "pwned"
    evil = f"$(touch {marker})`touch {marker}`;touch {marker}"
    log = tmp_path / "server.log"
    log.write_text(f"[2026-01-01] KV Cache is allocated. #tokens: 1, K size: 1.00 GB model_path='{evil}'\n")
    for kind, src, model in (("file", str(log), evil), ("file", evil, None), ("docker", evil, None),
                             ("none", None, evil)):
        cmd = C.host_script("0123456789abcdef", kind, None, None, src, model, 1 << 20, ("sglang",),
                            (b"KV Cache", f"{evil}".encode()))
        assert C.is_allowed(cmd)
        res = LocalRunner().run(cmd, 30, 1 << 20)
        parts = script_parts(res, b"0123456789abcdef")
        kinds = [p.kind for p in parts]
        assert kinds[:1] == ["hostname"] and kinds[-3:] == ["apps", "ps", "pmem"], (kind, res.stderr[-300:])
        if kind == "file" and src == str(log):
            lines = next(p for p in parts if p.kind == "flines")
            assert lines.stdout.startswith(b"1:[2026-01-01] KV Cache") and lines.args == (str(log),)
    assert not marker.exists()


def test_a_forged_marker_in_a_part_does_not_end_it():
    """A config.json or log line holding marker-like text (without the exec's random nonce) stays its part's."""
    from kvaudit.collect.interface import CommandResult
    from kvaudit.collect.session import script_parts

    n = b"0123456789abcdef"
    body = b'{"x": "\\n@@fedcba9876543210 end 0\\n"}\n@@0123456789abcdeg end 0\n'
    out = b"\n@@" + n + b" begin\tconfig\t/m/config.json\n" + body + b"\n@@" + n + b" end 0\n"
    err = b"\n@@" + n + b" begin\n\n@@" + n + b" end\n"
    parts = script_parts(CommandResult("x", 0, out, err, 0.1), n)
    assert len(parts) == 1 and parts[0].stdout == body and parts[0].args == ("/m/config.json",)
