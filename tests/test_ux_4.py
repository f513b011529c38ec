"""Issue 38, round 4 (items 5, 6 and 7): the everyday mistakes said in kvaudit's words with their exit codes, the
CLI's conventions (choices in --help, completion, whatif -o/--threshold), and the install (no pandas by default,
the SPDX licence, an image for the Kubernetes manifests)."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, KIMI_CONFIG, KIMI_LOG, cli, cli_process, openpty

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = ROOT / "contrib"


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# --- item 7: the install ----------------------------------------------------------------------------------------


def test_the_default_install_has_no_pandas_and_the_licence_is_an_spdx_string():
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # PEP 639: a table warns on every install with setuptools >= 77
    assert any(r.startswith("setuptools>=77") for r in _pyproject()["build-system"]["requires"])
    names = [re.split(r"[<>=!~;\[ ]", d)[0].lower() for d in project["dependencies"]]
    assert "pandas" not in names and "numpy" not in names and "pyarrow" not in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("pandas") for d in extras["history"])  # the one extra that brings pandas
    assert not any(d.startswith("pandas") for d in extras["parquet"])
    assert "kvaudit[history]" in (ROOT / "README.md").read_text()


def test_csv_export_imports_no_pandas(tmp_path):
    """fleet --csv through the csv module: the same columns, whole numbers whole, and pandas never imported."""
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n")
    out = tmp_path / "gpus.csv"
    code = (
        "import sys\nfrom kvaudit.cli import run\n"
        f"rc = run(['fleet', {str(inv)!r}, '--csv', {str(out)!r}, '-q', '-f', 'json'])\n"
        "print(rc, 'pandas' in sys.modules, 'numpy' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip().splitlines()[-1] == "0 False False", (p.stdout[-500:], p.stderr[-2000:])
    import csv

    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8 and rows[0]["host"].endswith("kimi-k25-tp8") and rows[0]["gpu"] == "0"
    assert rows[0]["kv_tokens"] == "159277" and rows[0]["findings"] == ""  # no code counts (info is not listed)


def test_parquet_export_through_pyarrow_alone(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n{tmp_path / 'gone'}\n")
    out = tmp_path / "gpus.parquet"
    r = cli("fleet", inv, "--csv", out, "--parquet", "-q", "-f", "json")
    assert r.code == 4, r.stderr  # the second host cannot be reached
    t = pq.read_table(out)
    assert str(t.schema.field("kv_tokens").type) == "int64" and str(t.schema.field("kv_gib").type) == "double"
    rows = t.to_pylist()
    assert len(rows) == 9 and rows[0]["kv_tokens"] == 159277
    assert rows[-1]["gpu"] is None and rows[-1]["status"].startswith("failed")  # the failed host: one row


def test_plan_history_without_pandas_says_which_extra(tmp_path):
    """Without pandas, plan --history is one line naming kvaudit[history] (exit 2), never an ImportError."""
    code = (
        "import sys\nsys.modules['pandas'] = None\nimport importlib.util\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'pandas' else real(n, *a)\n"
        "from kvaudit.cli import run\n"
        f"sys.exit(run(['plan', {str(KIMI_CONFIG)!r}, '--engine', 'sglang==0.5.9', '--gpu', 'h200', '--tp', '8', "
        f"'--history', {str(tmp_path / 'h.db')!r}]))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("kvaudit: error: plan --history analyses the fleet's history with pandas: pip install "
                                "'kvaudit[history]'")


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as Docker's parser reads them: comments dropped, continuation lines joined,
    each instruction a keyword Docker knows followed by its arguments."""
    known = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME", "USER", "WORKDIR",
             "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        keyword, _, rest = whole.partition(" ")
        assert keyword.upper() in known and keyword == keyword.upper(), whole
        assert rest.strip(), whole
        out.append((keyword, rest.strip()))
    assert not pending, "a continuation line at the end"
    return out


def test_the_image_installs_a_pinned_release_and_the_manifests_run_it_without_pip():
    steps = _dockerfile_instructions((CONTRIB / "image" / "Dockerfile").read_text())
    kinds = [k for k, _ in steps]
    assert kinds[0] in ("ARG", "FROM") and "FROM" in kinds and kinds.count("FROM") == 2
    for k, rest in steps:
        if k in ("ENTRYPOINT", "CMD"):
            assert isinstance(json.loads(rest), list)  # exec form: no shell between the runtime and kvaudit
    version = _pyproject()["project"]["version"]
    args = dict(rest.split("=", 1) for k, rest in steps if k == "ARG" and "=" in rest)
    assert args["KVAUDIT_VERSION"] == version
    (install,) = [rest for k, rest in steps if k == "RUN" and "pip install" in rest]
    spec = re.search(r"\"kvaudit\[k8s\]==\$\{KVAUDIT_VERSION\}\"", install)
    assert spec, install  # pinned: every build installs the same release
    assert ("USER", "65534:65534") in steps  # the manifests' runAsUser
    for name in ("daemonset.yaml", "cronjob.yaml"):
        text = (CONTRIB / "kubernetes" / name).read_text()
        (doc,) = yaml.safe_load_all(text)
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "DaemonSet" else \
            doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["image"].rsplit(":", 1)[1] == version, c["image"]
        assert "pip" not in json.dumps(c), name  # nothing installed at pod start
    # the CronJob's argv goes to the image's entrypoint (kvaudit): it parses with the real CLI
    import typer

    from kvaudit.cli import app

    (cron,) = yaml.safe_load_all((CONTRIB / "kubernetes" / "cronjob.yaml").read_text())
    argv = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    sub = typer.main.get_command(app).commands[argv[0]]
    ctx = sub.make_context(argv[0], [str(a) for a in argv[1:]])
    assert ctx.params["textfile_dir"] is not None and ctx.params["parallel"] == 8
    assert shlex.join(argv)  # plain strings


# --- item 5: everyday mistakes, each one line in kvaudit's words and its exit code --------------------------------


def _one_line(r) -> str:
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("kvaudit: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr


def test_a_model_directory_given_to_model_config_is_taken(tmp_path):
    model = tmp_path / "Kimi-K2.5"
    model.mkdir()
    (model / "config.json").write_bytes(KIMI_CONFIG.read_bytes())
    by_dir, by_file = cli("explain", KIMI_LOG, "-m", model), cli("explain", KIMI_LOG, "-m", KIMI_CONFIG)
    assert by_dir.code == by_file.code == 0, by_dir.stderr
    assert by_dir.stdout == by_file.stdout  # the same geometry, the same audit
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("explain", KIMI_LOG, "-m", empty)
    assert r.code == 2 and "a directory without config.json" in _one_line(r)


def test_a_rotated_gz_log_is_read(tmp_path):
    rotated = tmp_path / "sglang.log.1.gz"
    rotated.write_bytes(gzip.compress(KIMI_LOG.read_bytes()))
    r, plain = cli_process("explain", rotated, "-m", KIMI_CONFIG), cli_process("explain", KIMI_LOG, "-m", KIMI_CONFIG)
    assert r.code == plain.code == 0, r.stderr
    # the same report, the path aside (a path of another length wraps the line that names it elsewhere)
    assert " ".join(r.stdout.replace(str(rotated), "LOG").split()) == " ".join(
        plain.stdout.replace(str(KIMI_LOG), "LOG").split())
    cut = tmp_path / "cut.log.gz"
    data = gzip.compress(KIMI_LOG.read_bytes() * 50)
    cut.write_bytes(data[:len(data) // 2])  # a rotation caught half written
    r = cli("explain", cut)
    assert r.code == 2 and "not a whole gzip file" in _one_line(r)


def test_a_gzip_bomb_is_cut_at_the_bound(tmp_path):
    from kvaudit.rotated import RotatedLogError, read_gzipped

    bomb = tmp_path / "bomb.log.gz"
    bomb.write_bytes(gzip.compress(KIMI_LOG.read_bytes() + b"x" * (4 << 20)))
    with bomb.open("rb") as fh, pytest.raises(RotatedLogError, match="decompresses to more than 1,048,576 bytes"):
        read_gzipped(str(bomb), fh, limit=1 << 20)


def test_explain_dash_on_a_terminal_says_it_is_reading_stdin():
    import os

    master, slave = openpty()
    exe = Path(sys.executable).with_name("kvaudit")
    p = subprocess.Popen([str(exe), "explain", "-"], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(slave)
    try:
        first = p.stderr.readline().decode()  # said before the first byte arrives
        assert "reading the log from standard input" in first and "Ctrl-D" in first, first
        os.write(master, b"\x04")  # end of input, as Ctrl-D
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    assert p.returncode == 2  # nothing was typed: no startup


def test_usage_hints_only_for_the_option_they_are_about():
    r = cli("fleet", "hosts.txt", "--forks", "16")
    said = _one_line(r)
    assert r.code == 2 and "--parallel" in said and "--format" not in said  # Ansible's word, not a spelling guess
    r = cli("fleet", "hosts.txt", "--colour", "never")
    assert r.code == 2 and "--color" in _one_line(r) and "model-config" not in r.stderr  # no -c hint here
    r = cli("explain", KIMI_LOG, "-c", "config.json")
    assert r.code == 2 and "-m/--model-config" in _one_line(r)


def test_a_k8s_target_that_is_only_a_namespace_gets_the_pod_spelling():
    r = cli("check", "k8s:sglang-0")
    assert r.code == 2 and "k8s:/sglang-0" in _one_line(r) and "-l SELECTOR" in r.stderr


def test_capture_refuses_to_replace_another_hosts_capture(tmp_path):
    import shutil

    earlier = tmp_path / "ticket-4711"
    shutil.copytree(FIXTURES / "hosts" / "kimi-k25-tp8", earlier)
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    r = cli("capture", "gpu-99", "-o", earlier, "--timeout", "5")
    assert r.code == 2 and "holds the capture of local" in _one_line(r)
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before  # untouched
    # every node's own capture is of "local": another machine's is told by its host name (ux audit 2, item 1)
    r = cli("capture", "local", "-o", earlier, "--no-config")
    assert r.code == 2 and "holds the capture of gpu-node-07 (local there)" in _one_line(r)
    assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before


def test_one_host_is_one_host(tmp_path):
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{FIXTURES / 'hosts' / 'kimi-k25-tp8'}\n")
    r = cli("fleet", inv, "-q")
    assert r.code == 0 and r.stdout.startswith("kvaudit fleet: 1 ok - 1 host in "), r.stdout[:200]
    md = cli("fleet", inv, "-q", "-f", "markdown")
    assert "\n1 host (" in md.stdout


# --- item 6: conventions ----------------------------------------------------------------------------------------


def test_help_shows_the_choices_and_posix_usage():
    r = cli_process("explain", "--help")
    assert r.code == 0
    assert "Usage: kvaudit explain [OPTIONS] FILE" in r.stdout and "{file}" not in r.stdout
    assert "[text|json|markdown]" in r.stdout and "[auto|always|never]" in r.stdout
    d = cli_process("diff", "--help")
    assert "Usage: kvaudit diff [OPTIONS] A [B]" in d.stdout and "[text|json]" in d.stdout


def test_shell_completion_completes_commands_and_options():
    import os

    exe = Path(sys.executable).with_name("kvaudit")
    env = {**os.environ, "_KVAUDIT_COMPLETE": "complete_bash", "COMP_WORDS": "kvaudit wh", "COMP_CWORD": "1"}
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout.split() == ["whatif"], (p.stdout, p.stderr)
    env.update(COMP_WORDS="kvaudit whatif --thr", COMP_CWORD="2")
    p = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout.split() == ["--threshold"], (p.stdout, p.stderr)
    assert "--install-completion" in cli_process("--help").stdout


def test_whatif_takes_output_and_threshold(tmp_path):
    """The Kimi startup at mem_fraction_static 0.91 keeps 4.09 GiB for activations: ok by default, low headroom
    when the operator's threshold says 5 GiB (exit 1); -o writes the report, stdout stays empty."""
    out = tmp_path / "whatif.txt"
    r = cli("whatif", KIMI_LOG, "--mem-fraction-static", "0.91", "-o", out)
    assert r.code == 0 and r.stdout == "" and "ok: the reserve still covers" in out.read_text()
    r = cli("whatif", KIMI_LOG, "--mem-fraction-static", "0.91", "-o", out, "--threshold", "low_headroom_gib=5")
    assert r.code == 1 and r.stdout == "" and "LOW HEADROOM" in out.read_text()
    r = cli("whatif", KIMI_LOG, "--mem-fraction-static", "0.91", "--threshold", "low_headroom=5")
    assert r.code == 2 and "unknown threshold(s): low_headroom; known:" in _one_line(r)


def test_exit_codes_doc_names_every_commands_codes_and_130():
    text = (ROOT / "docs" / "exit-codes.md").read_text()
    assert "| 130 | `INTERRUPTED` |" in text
    for command in ("`diff`", "`plan`", "`whatif`", "`capture`", "`history`"):
        assert f"| {command} |" in text, command
    from kvaudit.status import ExitStatus

    assert ExitStatus.INTERRUPTED == 130
    assert "return 130" not in (ROOT / "kvaudit" / "cli.py").read_text()
