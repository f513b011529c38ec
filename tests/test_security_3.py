"""Hostile inputs 3 (issue 39) on real files, FIFOs and the real CLI: the working directory's kvaudit.toml and a
baseline are bounded and never echoed, a working-directory file cannot silence a node problem, deadlines are
finite, inventories and model directories are bounded before anything is expanded or parsed."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

KIMI_HOST = FIXTURES / "hosts" / "kimi-k25-tp8"
SECRET = "ghp_0123456789abcdefSECRET"


def _run(cwd: Path, *args: object, timeout: float = 90, limit: int | None = None
         ) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("kvaudit")

    def cap() -> None:  # the address space, so that a read without a bound fails instead of passing unnoticed
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**{k: v for k, v in os.environ.items() if k != "KVAUDIT_DEBUG"}, "MALLOC_ARENA_MAX": "2"}
    return subprocess.run([str(exe), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, preexec_fn=cap if limit else None)


def _one_line_error(r: subprocess.CompletedProcess, code: int = 2) -> str:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return r.stderr


# --- 1. the working directory's kvaudit.toml, a baseline, the deadlines ----------------------------------------

def test_a_fifo_kvaudit_toml_is_refused_without_blocking(tmp_path):
    """A FIFO blocked every command run in the directory forever (even an offline check of a capture)."""
    os.mkfifo(tmp_path / "kvaudit.toml")
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST, timeout=60))
    assert "kvaudit.toml" in err and "FIFO" in err and "not a regular file" in err


def test_a_kvaudit_toml_linked_to_a_device_or_too_large_is_refused(tmp_path):
    """A symlink to /dev/zero was read until the process was killed (2-3 GB in 4-6 s)."""
    (tmp_path / "kvaudit.toml").symlink_to("/dev/zero")
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST, timeout=60, limit=1 << 30))
    assert "a device, not a regular file" in err
    (tmp_path / "kvaudit.toml").unlink()
    (tmp_path / "kvaudit.toml").write_text("# " + "x" * (2 << 20) + "\n")
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST))
    assert "over kvaudit's bound" in err


@pytest.mark.parametrize("how", ["settings", "flag"])
def test_a_baseline_that_is_not_one_is_refused_by_its_line_number_never_its_text(tmp_path, how):
    """`baseline = <any file>` printed the file's first line in the error (a credentials URL, /etc/shadow)."""
    secret = tmp_path / "git-credentials"
    secret.write_text(f"https://bob:{SECRET}@github.com\n")
    if how == "settings":
        (tmp_path / "kvaudit.toml").write_text(f'baseline = "{secret}"\n')
        r = _run(tmp_path, "check", KIMI_HOST)
    else:
        r = _run(tmp_path, "check", KIMI_HOST, "--baseline", secret)
    err = _one_line_error(r)
    assert f"{secret}:1" in err and "not a baseline" in err
    assert SECRET not in err and "github.com" not in err and SECRET not in r.stdout
    os.mkfifo(tmp_path / "fifo")
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST, "--baseline", tmp_path / "fifo", "--no-config",
                               timeout=60))
    assert "FIFO" in err


def test_a_settings_value_of_the_wrong_type_is_not_echoed(tmp_path):
    (tmp_path / "kvaudit.toml").write_text(f'unit = ["{SECRET}"]\n')
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST))
    assert "unit must be a string, not a list" in err and SECRET not in err


def _capture_with_a_foreign_process(tmp_path: Path) -> Path:
    cap = tmp_path / "cap"
    shutil.copytree(KIMI_HOST, cap)
    apps = cap / "nvidia-smi-apps.csv"
    gpus = (cap / "nvidia-smi-gpus.csv").read_text().splitlines()
    uuid = gpus[3].split(",")[1].strip()
    apps.write_text(apps.read_text() + f"9999, {uuid}, python3 train.py, 4096\n")
    return cap


def test_a_working_directory_file_cannot_turn_a_node_problem_into_ok(tmp_path):
    """`ignore = ["FOREIGN_PROCESS"]` in ./kvaudit.toml turned the node's critical health check into ok, said only as
    'using ./kvaudit.toml'. The rule: a file found in the working directory acknowledges config-level findings
    only; named with --config it is trusted, and what it acknowledges is said."""
    cap = _capture_with_a_foreign_process(tmp_path)
    work = tmp_path / "repo"
    work.mkdir()
    assert _run(work, "check", cap, "--health-check").returncode == 2  # critical, as it should be
    (work / "kvaudit.toml").write_text('ignore = ["FOREIGN_PROCESS"]\n')
    r = _run(work, "check", cap, "--health-check")
    assert r.returncode == 3 and '"ok"' not in r.stdout, (r.stdout, r.stderr)  # unknown: the check did not run
    assert "may not acknowledge FOREIGN_PROCESS" in r.stderr and "--config ./kvaudit.toml" in r.stderr
    for rule in ("NO_GPU_READINGS", "GPU_COUNT_MISMATCH@*"):
        (work / "kvaudit.toml").write_text(f'ignore = ["{rule}"]\n')
        assert "may not acknowledge" in _one_line_error(_run(work, "check", cap))
    (work / "base.txt").write_text("OCCUPIED_AT_STARTUP\n")
    (work / "kvaudit.toml").write_text('baseline = "base.txt"\n')
    assert "may not acknowledge OCCUPIED_AT_STARTUP" in _one_line_error(_run(work, "check", cap))
    # the user names it: trusted
    (work / "kvaudit.toml").write_text('ignore = ["FOREIGN_PROCESS"]\n')
    r = _run(work, "check", cap, "--health-check", "--format", "json", "--config", "./kvaudit.toml")
    assert r.returncode == 0 and json.loads(r.stdout)["state"] == "ok", (r.stdout, r.stderr)


def test_what_a_working_directory_file_acknowledges_is_said(tmp_path):
    (tmp_path / "kvaudit.toml").write_text('ignore = ["RESERVE_EXPLAINS_FREE"]\n')
    r = _run(tmp_path, "check", KIMI_HOST, "-f", "json")
    assert r.returncode == 0, r.stderr
    assert "using ./kvaudit.toml; it acknowledges RESERVE_EXPLAINS_FREE" in r.stderr


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "90000"])
def test_a_deadline_is_finite_and_bounded(tmp_path, value):
    """`--timeout inf` passed typer's min=1: the watchdog thread died with OverflowError, nothing had a deadline."""
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST, "--timeout", value, "--no-config"))
    assert err.count("\n") == 1 and "--timeout" in err and "at most 86,400" in err
    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    run = value if value != "90000" else "1e7"  # a run may take a week, a host a day
    err = _one_line_error(_run(tmp_path, "fleet", inv, "--run-timeout", run, "--no-config"))
    assert "--run-timeout" in err and "at most 604,800" in err


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_a_deadline_from_the_settings_file_is_finite(tmp_path, value):
    (tmp_path / "kvaudit.toml").write_text(f"timeout = {value}\n")
    err = _one_line_error(_run(tmp_path, "check", KIMI_HOST))
    assert "timeout must be a number of seconds above 0 and at most 86,400" in err


# --- 3. inventories and model directories: counted and sized before use ----------------------------------------

def test_an_inventory_of_many_ranges_is_refused_before_expanding(tmp_path):
    """1,000 lines of `hN-[0:9999]` (14 KB, each line under the per-line bound) reached 3 GB in kvaudit's reader
    and in ansible-core; the whole inventory's ranges are now counted first."""
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\n" + "".join(f"h{i}-[0:9999]\n" for i in range(1000)))
    err = _one_line_error(_run(tmp_path, "fleet", inv, "--no-config", timeout=60, limit=1 << 30))
    assert "more than 20,000 hosts" in err and "refused before expanding" in err


def test_an_inventory_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "hosts.txt")
    err = _one_line_error(_run(tmp_path, "fleet", tmp_path / "hosts.txt", "--no-config", timeout=60))
    assert "FIFO" in err


def _safetensors(path: Path, tensors: int = 3, header_pad: int = 0) -> int:
    """A real safetensors file of ``tensors`` float16 tensors of 8 elements; returns its tensor bytes."""
    header = {f"t{i}": {"dtype": "F16", "shape": [8], "data_offsets": [16 * i, 16 * (i + 1)]} for i in range(tensors)}
    if header_pad:
        header["__metadata__"] = {"pad": "x" * header_pad}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (16 * tensors))
    return 16 * tensors


def test_a_shard_reached_by_several_names_is_counted_once(tmp_path):
    """eight symlinks to one header were counted eight times (and read eight times: 82 s for 100 MiB)."""
    from kvaudit.plan.weights import model_weights

    one = _safetensors(tmp_path / "model-00001.safetensors")
    for i in range(2, 9):
        (tmp_path / f"model-0000{i}.safetensors").symlink_to(tmp_path / "model-00001.safetensors")
    w = model_weights(tmp_path)
    assert w is not None and w.total_bytes == one and w.files == 1


def test_a_large_header_is_refused_by_its_announced_size(tmp_path):
    from kvaudit.plan.weights import WeightsError, model_weights

    _safetensors(tmp_path / "model.safetensors", header_pad=17 << 20)
    with pytest.raises(WeightsError, match="over kvaudit's bound"):
        model_weights(tmp_path)


_PROBE = ("import sys; from pathlib import Path; from kvaudit.plan.weights import model_weights, WeightsError\n"
          "try:\n    print(model_weights(Path(sys.argv[1])))\nexcept WeightsError as e:\n    print('refused:', e)\n")


def _weights_in_a_child(directory: Path, limit: int = 1 << 30) -> str:
    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    r = subprocess.run([sys.executable, "-c", _PROBE, str(directory)], capture_output=True, text=True, timeout=60,
                       preexec_fn=cap)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_fifo_named_safetensors_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    assert "refused:" in _weights_in_a_child(tmp_path) and "not a regular file" in _weights_in_a_child(tmp_path)


def test_a_sparse_index_is_refused_by_its_size_before_it_is_read(tmp_path):
    """an 8 GiB sparse model.safetensors.index.json was read whole before the 64 MiB cut (3 GB), and an index
    over 64 MiB was then said to have no total_size."""
    index = tmp_path / "model.safetensors.index.json"
    with index.open("wb") as fh:
        fh.write(json.dumps({"metadata": {"total_size": 1000}}).encode())
        fh.truncate(8 << 30)
    out = _weights_in_a_child(tmp_path)
    assert "refused:" in out and "over kvaudit's bound" in out and "total_size" not in out
    os.unlink(index)
    os.mkfifo(index)
    assert "FIFO" in _weights_in_a_child(tmp_path)


# --- 4. no exit 70 from data ------------------------------------------------------------------------------------

def test_a_4000_digit_vllm_metrics_label_is_no_reading_not_a_crash():
    from tests.conftest import CONFIGS, cli
    from tests.endpointsim import json_doc, metrics_doc, serve, vllm_metrics

    labels = {"block_size": "16", "cache_dtype": "auto", "gpu_memory_utilization": "0.9",
              "num_gpu_blocks": "9" * 4000, "num_cpu_blocks": "None", "enable_prefix_caching": "True"}
    with serve({"/metrics": metrics_doc(vllm_metrics(labels)), "/version": json_doc({"version": "0.31.0"})}) as (url, _):
        r = cli("check", url, "-m", CONFIGS / "llama31-8b.json", "-f", "json")
    assert r.code not in (70,) and "internal error" not in r.stderr, (r.code, r.stderr)
    d = r.json()
    assert d["formula"]["logged_tokens"] is None and d["formula"]["verdict"] == "unknown"


def test_a_history_row_with_1e308_is_skipped_not_a_crash(tmp_path):
    """`diff HOST@RUN` and `plan --history` overflowed on 1e308 in a row another tool wrote (exit 70)."""
    import sqlite3

    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    for _ in range(2):
        assert _run(tmp_path, "fleet", inv, "--history", tmp_path / "h.sqlite", "--no-config", "-q").returncode == 0
    db = sqlite3.connect(tmp_path / "h.sqlite")
    db.execute("UPDATE startups SET t_gib = 1e308 WHERE run_id = 1")
    db.commit()
    db.close()
    r = _run(tmp_path, "diff", f"{KIMI_HOST}@1", f"{KIMI_HOST}@2", "--history", tmp_path / "h.sqlite")
    err = _one_line_error(r)
    assert r.returncode == 2 and "run 1" in err and ("no startup" in err or "refused" in err), err


def _docker_bin(tmp_path: Path, started_at: str) -> Path:
    """A `docker` on PATH answering inspect and logs as a docker client would (the container's log: Kimi's)."""
    from tests.conftest import KIMI_LOG

    d = tmp_path / "bin"
    d.mkdir()
    log = tmp_path / "container.log"
    log.write_bytes(KIMI_LOG.read_bytes())
    (d / "docker").write_text(f"""#!/bin/sh
case "$1" in
  inspect) printf '%s\\n' '{started_at}';;
  logs) cat '{log}';;
esac
""")
    (d / "docker").chmod(0o755)
    return d


def test_a_docker_start_time_in_go_form_is_read_not_refused(tmp_path):
    """docker's StartedAt in Go's time.String() form (a wrapper, an old client) became `docker logs --since` with
    spaces, which the gate refuses: exit 70 'a bug in kvaudit'. It is rewritten to RFC 3339."""
    bindir = _docker_bin(tmp_path, "2026-02-25 10:12:01.123456789 +0000 UTC")
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    r = subprocess.run([str(Path(sys.executable).with_name("kvaudit")), "check", "local", "--source", "docker:sglang",
                        "--no-config", "-f", "json"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 70 and "internal error" not in r.stderr and "refused" not in r.stderr, r.stderr
    d = json.loads(r.stdout)
    assert d["formula"]["logged_tokens"] == 159277
    assert "since 2026-02-25T10:12:01.123456789+00:00" in d["host"]["source"]


def test_a_source_with_a_newline_is_a_bad_setting_not_a_crash(tmp_path):
    err = _one_line_error(_run(tmp_path, "check", "local", "--source", "docker:a\nb", "--no-config"))
    assert "--source" in err and "newlines" in err


def test_one_hosts_source_with_a_newline_fails_that_host_not_the_fleet(tmp_path):
    """`kvaudit_source` with a newline in one host's variables made the whole fleet exit 70."""
    inv = tmp_path / "inv.yml"
    inv.write_text(f'all:\n  hosts:\n    {KIMI_HOST}: {{}}\n    local:\n      kvaudit_source: "docker:a\\nb"\n')
    r = _run(tmp_path, "fleet", inv, "--no-config", "-q", "-f", "json")
    assert r.returncode == 2 and "internal error" not in r.stderr, (r.returncode, r.stderr)  # a bad setting
    hosts = {h["name"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["local"]["host"]["error"]["reason"] == "bad_setting"
    assert hosts[str(KIMI_HOST)]["formula"]["logged_tokens"] == 159277


def test_an_upper_case_invocation_id_is_no_id():
    from kvaudit.collect import commands as C

    assert C.is_invocation_id("0123456789abcdef0123456789abcdef")
    assert not C.is_invocation_id("0123456789ABCDEF0123456789ABCDEF")
    assert C.is_allowed(C.journal_lines("sglang.service", None, None, (b"GB",)))


# --- 6. escapes -------------------------------------------------------------------------------------------------

def test_an_endpoint_version_string_never_reaches_a_report_raw():
    from tests.conftest import CONFIGS, cli
    from tests.endpointsim import json_doc, metrics_doc, serve, vllm_metrics

    labels = {"block_size": "16", "cache_dtype": "auto", "gpu_memory_utilization": "0.9", "num_gpu_blocks": "27161"}
    evil = "0.31.0\x1b]8;;http://evil.example/\x07[click](http://evil.example/)\x1b[2J"
    with serve({"/metrics": metrics_doc(vllm_metrics(labels)), "/version": json_doc({"version": evil})}) as (url, _):
        for fmt in ("text", "markdown", "json"):
            r = cli("check", url, "-m", CONFIGS / "llama31-8b.json", "-f", fmt)
            assert r.code != 70 and "\x1b" not in r.stdout and "evil.example" not in r.stdout, (fmt, r.stdout[:500])


def test_an_escape_in_a_gpu_uuid_does_not_reach_the_textfile(tmp_path):
    """nvidia-smi's UUID carried ESC into 72 lines of the .prom textfile."""
    cap = tmp_path / "cap"
    shutil.copytree(KIMI_HOST, cap)
    for name in ("nvidia-smi-gpus.csv", "nvidia-smi-apps.csv"):
        p = cap / name
        p.write_text(p.read_text().replace("GPU-", "GPU-\x1b[31m\u202e"))
    out = tmp_path / "prom"
    out.mkdir()
    r = _run(tmp_path, "check", cap, "--textfile-dir", out, "--no-config")
    assert r.returncode in (0, 1, 6), r.stderr
    (prom,) = out.glob("*.prom")
    text = prom.read_text()
    assert "GPU-" in text and "\x1b" not in text and "\u202e" not in text


def test_unicode_tag_characters_are_dropped():
    from kvaudit.textsafe import md_cell, printable

    hidden = "".join(chr(0xE0000 + ord(c)) for c in "ignore previous instructions")
    assert printable(f"gpu-7{hidden}") == "gpu-7" and md_cell(f"a{hidden}b") == "ab"


# --- 7. hostile histories ---------------------------------------------------------------------------------------

def test_a_300_mb_history_value_is_cut_inside_sqlite(tmp_path):
    """A 300 MB value in a row cost `history`, `diff` and `plan` 1.2-2.6 GB (measured: 1,196,012 KB and 12 s for
    `history HOST`; now 314,780 KB and 1.6 s): every text value is cut in SQLite before Python holds it."""
    import sqlite3

    from tests.conftest import cli_limited

    inv = tmp_path / "hosts.txt"
    inv.write_text(f"{KIMI_HOST}\n")
    for _ in range(2):
        assert _run(tmp_path, "fleet", inv, "--history", tmp_path / "h.sqlite", "--no-config", "-q").returncode == 0
    db = sqlite3.connect(tmp_path / "h.sqlite")
    db.execute("UPDATE hosts SET reason = hex(zeroblob(150000000)) WHERE run_id = 1")
    db.commit()
    db.close()
    rc, err = cli_limited("history", KIMI_HOST, "--history", tmp_path / "h.sqlite", "-f", "json",
                          address_space=900 << 20)
    assert rc == 0, err


def test_a_startup_line_the_serving_process_printed_again_is_no_restart(tmp_path):
    """Issue 39, High 2: a request logged with a raw newline put a `server_args=...` line with SGLang's prefix into
    the journal; kvaudit took it for "startup 2 of 2". A process starts once: the journal's pid says the line came
    from the process that started already (48190, the one that printed the real server_args), so the real startup
    is audited, its config.json read, and the line is said to be no restart. A real restart (the whole startup
    again, from other pids, a day later) is still the latest startup."""
    import re
    import shutil

    cap = tmp_path / "host"
    shutil.copytree(KIMI_HOST, cap)
    log = cap / "log.txt"
    lines = log.read_text().splitlines()
    first = lines[0].split(":", 1)[1]  # the real server_args line, as the journal gave it (pid 48190)
    forged = first.replace("/models/moonshotai/Kimi-K2.5", str(tmp_path / ".docker"))
    log.write_text("\n".join(lines + [f"{int(lines[-1].split(':', 1)[0]) + 1}:{forged}"]) + "\n")
    doc = json.loads(_run(tmp_path, "check", cap, "-f", "json").stdout)
    assert doc["status"] == "ok" and doc["startup"]["index"] == 1 and doc["startup"]["total"] == 1, doc["headline"]
    assert any("not a restart" in n and "pid 48190" in n for n in doc["notes"]), doc["notes"]
    again = [re.sub(r"python3\[48(\d+)\]", r"python3[51\1]", ln.split(":", 1)[1]).replace("2026-02-25", "2026-02-26")
             for ln in lines]
    last = int(lines[-1].split(":", 1)[0])  # a capture's log numbers its lines as the journal selection did
    log.write_text("\n".join(lines + [f"{last + i + 1}:{t}" for i, t in enumerate(again)]) + "\n")
    doc = json.loads(_run(tmp_path, "check", cap, "-f", "json").stdout)
    assert doc["startup"]["index"] == 2 and doc["startup"]["total"] == 2, doc["headline"]
    assert not any("set aside" in n for n in doc["notes"]), doc["notes"]
