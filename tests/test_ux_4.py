"""Issue 38, round 4 (items 5, 6 and 7): the everyday mistakes said in kvaudit's words with their exit codes, the
CLI's conventions (choices in --help, completion, whatif -o/--threshold), and the install (no pandas by default,
the SPDX licence, an image for the Kubernetes manifests)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, KIMI_CONFIG, cli

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
    assert rows[0]["kv_tokens"] == "159277" and "TOKENS_MATCH" in rows[0]["findings"]


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
