"""The real CLI: exit codes, input handling, formats. Bad input gets one line and a documented code."""

from __future__ import annotations


import pytest

from kvaudit.status import ExitStatus
from tests.conftest import KIMI_CONFIG, KIMI_LOG, ROOT, SAMPLES, cli, cli_process


def test_demo_scenario_as_a_user_runs_it():
    r = cli_process("explain", KIMI_LOG, "--model-config", KIMI_CONFIG)
    assert r.code == ExitStatus.OK, r.stderr
    assert "MATCH" in r.stdout and "RESERVE_EXPLAINS_FREE" in r.stdout
    assert "94.01" in r.stdout and "11.28" in r.stdout and "70,272" in r.stdout and "11.18" in r.stdout
    assert r.stderr == ""


def test_reads_standard_input():
    r = cli("explain", "-", "--format", "json", stdin=(SAMPLES / "sglang_029.log").read_bytes())
    assert r.code == ExitStatus.OK
    d = r.json()
    assert d["source"] == "stdin" and d["formula"]["logged_tokens"] == 105531


def test_exit_codes_follow_the_worst_finding():
    assert cli("explain", KIMI_LOG, "-m", KIMI_CONFIG).code == ExitStatus.OK
    assert cli("explain", SAMPLES / "sglang_013.log").code == ExitStatus.WARNINGS  # UNEXPLAINED_MEMORY
    assert cli("explain", SAMPLES / "sglang_025.log").code == ExitStatus.LOG_ERRORS  # STARTUP_FAILED


@pytest.mark.parametrize("content,message", [
    (b"", "empty"),
    (b"\x00\x01\x02binary" * 100, "binary"),
    (b"just some text\nwith no engine lines\n", "no SGLang, vLLM, TensorRT-LLM or LMDeploy startup"),
    (b"x" * (50 << 20), "no SGLang, vLLM, TensorRT-LLM or LMDeploy startup"),  # one 50 MB line
    (b"2024-06-01T10:00:00Z INFO text_generation_launcher: Starting shard rank=0\n", "TGI"),
])
def test_bad_input_gets_one_line_and_exit_2(tmp_path, content, message):
    p = tmp_path / "input.log"
    p.write_bytes(content)
    r = cli_process("explain", p)
    assert r.code == ExitStatus.BAD_INPUT
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,message", [
    (["explain", "/nonexistent/log"], "cannot read"),
    (["explain", "."], "directory"),
    (["explain", str(KIMI_LOG), "--format", "xml"], "--format"),
    (["explain", str(KIMI_LOG), "--mem-fraction-static", "1.5"], "--mem-fraction-static"),
    (["explain", str(KIMI_LOG), "--model-config", "/nonexistent.json"], "cannot read model config"),
    (["explain", str(KIMI_LOG), "--startup", "5"], "holds 1 startup"),
    (["explain", str(KIMI_LOG), "--threshold", "bogus=1"], "unknown threshold"),
    (["explain", str(KIMI_LOG), "--startup", "1", "--all-startups"], "exclude"),
    (["explain"], "Missing argument"),
    (["nosuchcommand"], "No such command"),
    (["whatif", str(KIMI_LOG)], "at least one"),
    (["check", "/nonexistent/capture"], "not a kvaudit capture directory"),
    (["check", "local", "--source", "kubectl:pod"], "docker:NAME or file:PATH"),
    (["fleet"], "name an inventory"),
    (["fleet", "/nonexistent/inventory.ini"], "cannot read inventory"),
    (["whatif", str(KIMI_LOG), "--kv-cache-dtype", "fp8_e4m3"], "--model-config"),
])
def test_usage_errors_exit_2(args, message):
    r = cli(*args)
    assert r.code == ExitStatus.BAD_INPUT, (r.stdout, r.stderr)
    assert message in r.stderr and r.stderr.count("\n") == 1


def test_config_that_is_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{oops")
    r = cli("explain", KIMI_LOG, "-m", p)
    assert r.code == ExitStatus.BAD_INPUT and "not JSON" in r.stderr


def test_all_startups_json_and_startup_selection(tmp_path):
    p = tmp_path / "two.log"
    p.write_bytes((SAMPLES / "sglang_029.log").read_bytes() + KIMI_LOG.read_bytes())
    r = cli("explain", p, "--all-startups", "-f", "json")
    d = r.json()
    assert [a["startup"]["index"] for a in d["audits"]] == [1, 2]
    first = cli("explain", p, "--startup", "1", "-f", "json").json()
    assert first["formula"]["logged_tokens"] == 105531 and first["startup"]["total"] == 2


def test_markdown_and_output_file(tmp_path):
    out = tmp_path / "report.md"
    r = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG, "-f", "markdown", "-o", out)
    assert r.code == 0 and r.stdout == ""
    md = out.read_text()
    head, _, rest = md.partition("\n\n")
    assert head.startswith("**OK 159,277 tokens = formula") and rest.startswith("## kvaudit") and "| TP0 |" in md and "`RESERVE_EXPLAINS_FREE`" in md


def test_colour_only_when_asked_or_on_a_terminal():
    plain = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG)
    assert "\x1b[" not in plain.stdout
    coloured = cli("explain", KIMI_LOG, "-m", KIMI_CONFIG, "--color", "always")
    assert "\x1b[32mMATCH" in coloured.stdout


def test_version_and_help():
    assert cli("--version").stdout.startswith("kvaudit ")
    r = cli_process("explain", "--help")
    assert r.code == 0 and "--model-config" in r.stdout


@pytest.mark.parametrize("mfs,risk", [("0.90", "ok"), ("0.95", "low"), ("0.97", "oom")])
def test_whatif_fraction(mfs, risk):
    r = cli("whatif", KIMI_LOG, "-m", KIMI_CONFIG, "--mem-fraction-static", mfs, "-f", "json")
    d = r.json()["whatif"]
    assert d["risk"] == risk
    gain = (float(mfs) - 0.88) * 94.01 * 2**30 / 70272
    assert d["tokens_after"]["low"] - d["tokens_before"] == pytest.approx(gain, abs=150)
    assert d["reserve_gib_after"] == pytest.approx((1 - float(mfs)) * 94.01, abs=0.01)
    assert r.code == (0 if risk == "ok" else 1)


def test_whatif_fp8_kv_doubles_tokens():
    d = cli("whatif", KIMI_LOG, "-m", KIMI_CONFIG, "--kv-cache-dtype", "fp8_e4m3", "-f", "json").json()["whatif"]
    assert d["tokens_after"]["low"] == pytest.approx(2 * 159277, abs=200)
    text = cli("whatif", KIMI_LOG, "-m", KIMI_CONFIG, "--kv-cache-dtype", "fp8_e4m3").stdout
    assert "KV tokens" in text and "318," in text


def test_internal_errors_are_one_line(monkeypatch):
    import kvaudit.explain as ex

    def boom(*a, **k):
        raise RuntimeError("synthetic")

    monkeypatch.setattr(ex, "audit", boom)
    r = cli("explain", KIMI_LOG)
    assert r.code == ExitStatus.INTERNAL_ERROR and "internal error" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("number", ["9" * 400, "1e999"])
def test_absurd_numbers_in_a_log_are_skipped_not_fatal(tmp_path, number):
    """A memory line holding a number no engine prints (it would overflow the arithmetic) is skipped and said
    to be; the rest of the log is audited; the JSON is strict."""
    import json

    text = (SAMPLES / "vllm_016.log").read_text().replace("56.18GiB", f"{number}GiB", 1)
    p = tmp_path / "hostile.log"
    p.write_text(text)
    r = cli_process("explain", p, "-f", "json")
    assert r.code in (0, 1), r.stderr
    d = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert any("absurd" in n or "no engine prints" in n for n in d["notes"])


CONTROL = ("\x1b", "\x07", "\x9b", "\x90", "\x9d", "\x00", "\x7f")


def test_terminal_escapes_in_a_log_never_reach_the_output(tmp_path):
    """An error line carrying an OSC title change, a C1 CSI and a BEL: the report quotes the error, without
    any control character, in text and in Markdown (where `|` and `<` are escaped too)."""
    hostile = ("(EngineCore pid=42) ERROR 08-03 07:00:46 [core.py:700] ValueError: No available memory for the cache "
               "blocks. \x1b]0;pwned\x07 \x9b31mred\x9b0m | <script>alert(1)</script>\n")
    p = tmp_path / "hostile.log"
    p.write_text((ROOT / "fixtures/vllm_classes/negative-available-0.25.log").read_text() + hostile,
                 encoding="utf-8")
    text = cli("explain", p).stdout
    assert "No available memory" in text and not any(c in text for c in CONTROL)
    md = cli("explain", p, "-f", "markdown").stdout
    assert not any(c in md for c in CONTROL) and "<script>" not in md and "\\|" in md


def test_file_names_in_errors_are_printable(tmp_path):
    r = cli_process("explain", tmp_path / "no\x1b[2Jsuch.log")
    assert r.code == 2 and "\x1b" not in r.stderr and "such.log" in r.stderr


def test_a_prompt_that_looks_like_a_startup_is_not_read(tmp_path):
    """A request log whose prompt forges startup lines (another server_args with another model path and
    fraction, a Load weight end): the audit is the real startup's, and the forged config path is never used."""
    real = (SAMPLES / "sglang_029.log").read_text()
    forged = ("[2025-01-01 10:00:00 TP0] Receive: obj=GenerateReqInput(text='server_args=ServerArgs("
              "model_path=\"/etc/evil\", mem_fraction_static=0.1, tp_size=1) Load weight end. type=Qwen2ForCausalLM, "
              "dtype=torch.bfloat16, avail mem=1.00 GB, mem usage=1.00 GB. KV Cache is allocated. #tokens: 5, "
              "K size: 0.01 GB, V size: 0.01 GB max_total_num_tokens=5', rid='x')\n")
    p = tmp_path / "forged.log"
    p.write_text(real + forged * 3)
    base = cli("explain", SAMPLES / "sglang_029.log", "-f", "json").json()
    got = cli("explain", p, "-f", "json").json()
    assert got["formula"] == base["formula"] and got["startup"]["total"] == base["startup"]["total"]
    assert "/etc/evil" not in str(got)


@pytest.mark.parametrize("command", ["check", "explain", "whatif", "capture", "fleet", "history"])
def test_help_explains_every_option_in_panels(command):
    """--help renders (no markup error from a bracket in a help text), every option says what it does, flags
    show no <bool>, and options are grouped into panels (issue 11, item 16)."""
    import typer

    from kvaudit.cli import app

    r = cli_process(command, "--help")
    assert r.code == 0 and "internal error" not in r.stderr
    assert not [line for line in r.stdout.splitlines() if "<bool>" in line and "--help" not in line]
    click_cmd = typer.main.get_command(app).commands[command]
    options = [p for p in click_cmd.params if p.param_type_name == "option" and p.name != "help"]
    assert all(p.help for p in options), [p.name for p in options if not p.help]
    if command in ("check", "fleet"):
        assert "Where to read" in r.stdout and "Output" in r.stdout


def test_fleet_format_html_points_at_the_html_option():
    r = cli("fleet", "inventory.txt", "-f", "html")
    assert r.code == 2 and "use --html FILE" in r.stderr


def test_every_explained_failure_is_one_kind_that_carries_its_exit_status():
    """issue 20: one error base class (kvaudit.errors.KvauditError) carries the exit status; the CLI prints any
    of them in one line and exits with it, and no call site translates one into another."""
    import inspect

    from kvaudit import cli as cli_module
    from kvaudit.errors import KvauditError
    from kvaudit.fleet import history, inventory, preflight, settings
    from kvaudit import ignores, model_config
    from kvaudit.parse import lines
    from kvaudit.report import table_export

    for module in (history, inventory, preflight, settings, ignores, model_config, lines, table_export, cli_module):
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == module.__name__ and issubclass(obj, Exception):
                assert issubclass(obj, KvauditError), f"{module.__name__}.{name}"
    assert "raise Fail(str(exc))" not in inspect.getsource(cli_module).replace(
        "except ValueError as exc:\n        raise Fail(str(exc))", "").replace(
        "except ValueError as exc:\n            raise Fail(str(exc))", "")
    assert cli_module.Fail("x", ExitStatus.AUTH_REFUSED).status == ExitStatus.AUTH_REFUSED
