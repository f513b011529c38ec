"""kvaudit fleet against 20 real sshd instances on 127.0.0.1, each with its own journal and replayed
nvidia-smi; three of them broken (down, hanging, changed host key)."""

from __future__ import annotations

import html.parser
import os
import time
from pathlib import Path

import pytest

from kvaudit.status import ExitStatus
from tests import hostsim
from tests.collect.conftest import CAPTURE, needs_journal, needs_sshd
from tests.conftest import KIMI_CONFIG, KIMI_LOG, SAMPLES, cli_process

pytestmark = [needs_sshd, needs_journal]
N = 20
DOWN, HANGS, CHANGED = 18, 19, 20
VLLM = 7  # a vLLM V1 host (Llama-3-8B on one H200) among the SGLang ones
TRT = 12  # a TensorRT-LLM host (Llama-3.1-8B on one H100, trtllm-serve.service)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    key = root / "client_key"
    pub = hostsim.keygen(key)
    other = hostsim.keygen(root / "impostor")
    gpus = (CAPTURE / "nvidia-smi-gpus.csv").read_text()
    apps = (CAPTURE / "nvidia-smi-apps.csv").read_text()
    qwen_gpu = "0, GPU-qwen-0000, NVIDIA GeForce RTX 3090, 00000000:01:00.0, 24576, 283, 22538, 1755, 550.54.15\n"
    hosts, daemons, lines, known = [], [], ["[gpus]"], []
    for i in range(1, N + 1):
        name = f"gpu-{i:02d}"
        if i == VLLM:
            from tests.reconcile.test_vllm import V1_0101

            log = V1_0101.replace("/models/Meta-Llama-3-8B", "/models/moonshotai/Kimi-K2.5").encode()
            h = hostsim.make_host(root / name, log, "0, GPU-h200-0000, NVIDIA H200, 00000000:18:00.0, 143771, 614, "
                                  "127500, 15657, 590.48.01\n", "454, GPU-h200-0000, VLLM::EngineCore, 127480\n",
                                  (Path(__file__).parents[2] / "fixtures/configs/llama3-8b.json").read_text())
        elif i == TRT:
            from tests.collect.test_check_trtllm import APPS, H100, TRT_LOG

            h = hostsim.make_host(root / name, TRT_LOG.read_bytes(), H100, APPS, None, unit="trtllm-serve.service")
        elif i % 5 == 0:  # every fifth host serves a small Qwen model on one RTX 3090
            h = hostsim.make_host(root / name, (SAMPLES / "sglang_029.log").read_bytes(), qwen_gpu,
                                  "4711, GPU-qwen-0000, sglang::scheduler_TP0, 22500\n",
                                  (Path(__file__).parents[2] / "fixtures/configs/qwen2.5-7b.json").read_text())
        else:
            h = hostsim.make_host(root / name, KIMI_LOG.read_bytes(), gpus, apps, KIMI_CONFIG.read_text())
        if i == HANGS:
            h.set_smi_mode("hang")
        d = None if i == DOWN else hostsim.start_sshd(root / name / "sshd", pub, [h.bin])
        if d is None:
            held, port = hostsim.closed_port()  # refused for the whole module, whatever else starts
        else:
            port = d.port
        if d:
            daemons.append(d)
            pubkey = d.host_pub if i != CHANGED else " ".join(other.split()[:2])
            known.append(f"[127.0.0.1]:{port} {pubkey}")
        lines.append(f"{name} ansible_host=127.0.0.1 ansible_port={port} kvaudit_journal_directory={h.journal}")
        hosts.append(h)
    user = os.environ.get("USER") or "root"
    (root / "inventory.ini").write_text("\n".join(lines) + f"\n\n[gpus:vars]\nansible_user={user}\n")
    (root / "known_hosts").write_text("\n".join(known) + "\n")
    (root / "ssh_config").write_text(f"Host 127.0.0.1\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
                                     f"  UserKnownHostsFile {root}/known_hosts\n  ConnectTimeout 10\n")
    yield root, hosts
    for d in daemons:
        d.stop()


def run_fleet(root: Path, *extra: str):
    t = time.monotonic()
    r = cli_process("fleet", root / "inventory.ini", "--ssh-config", root / "ssh_config", "--parallel", "8",
                    "--timeout", "20", "--run-timeout", "120", "--history", root / "history.sqlite", "--format",
                    "json", "--quiet", *extra, timeout=180)
    runs = sorted(root.glob("run-*.json"))
    (root / f"run-{len(runs) + 1}.json").write_text(r.stdout)  # kept for a failure's post-mortem
    return r, time.monotonic() - t


def test_twenty_hosts_three_broken(fleet):
    root, hosts = fleet
    (root / "textfile").mkdir(exist_ok=True)
    r, wall = run_fleet(root, "--textfile-dir", root / "textfile", "--html", root / "report.html",
                        "--csv", root / "gpus.csv")
    assert r.code == ExitStatus.UNREACHABLE, r.stderr  # "some hosts unreachable"
    assert wall < 150  # ends by its --run-timeout (120 s), whatever the load
    d = r.json()
    by_name = {h["name"]: h for h in d["hosts"]}
    failed = {n: h["host"]["error"]["reason"] for n, h in by_name.items() if h["host"]["error"]}
    # a hung nvidia-smi costs that host its readings, not its audit (issue 39, item 5)
    assert failed == {f"gpu-{DOWN:02d}": "unreachable", f"gpu-{CHANGED:02d}": "host_key"}, {n: h["host"]["error"] for n, h in by_name.items()
                                                          if h["host"]["error"]}
    audited = [h for h in d["hosts"] if not h["host"]["error"]]
    assert len(audited) == 18
    hung = by_name[f"gpu-{HANGS:02d}"]
    assert hung["gpus"] == [] and any("no answer within" in p for p in hung["host"]["partial"])
    for h in audited:
        assert h["formula"]["verdict"] == "match", h["name"]
        n = int(h["name"][4:])
        expected = {VLLM: 702800, TRT: 446208}.get(n, 105531 if n % 5 == 0 else 159277)
        assert h["formula"]["logged_tokens"] == expected
        assert h["engine"] == {VLLM: "vllm", TRT: "trtllm"}.get(n, "sglang")
    assert by_name["gpu-07"]["formula"]["bytes_per_token"] == 131072  # from the host's config.json
    assert by_name["gpu-07"]["gpus"][0]["rank"] == "TP0"
    assert d["run"]["failed"] == 2 and d["run"]["deadline_hit"] is False
    assert d["run"]["first_run"] is True and d["drift"] == []  # said as the first run, not as "no change"

    # the textfile passes Prometheus' own parser and carries the JSON's numbers
    from prometheus_client.parser import text_string_to_metric_families

    text = (root / "textfile" / "kvaudit-fleet-inventory.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (build,) = fams["kvaudit_build_info"].samples
    assert build.value == 1 and build.labels["version"]
    status = {(s.labels["host"], s.labels["status"]): s.value for s in fams["kvaudit_host_status"].samples}
    assert status[(f"gpu-{DOWN:02d}", "failed")] == 1 and status[(f"gpu-{DOWN:02d}", "ok")] == 0
    assert sum(v for (h, _), v in status.items() if h == "gpu-01") == 1  # one status per host, each its own series
    failure = {s.labels["host"]: s.labels["reason"] for s in fams["kvaudit_host_failure"].samples}
    assert failure[f"gpu-{DOWN:02d}"] == "unreachable"
    uuids = {(s.labels["host"], s.labels["gpu"]): s.labels["UUID"] for s in fams["kvaudit_kv_tokens"].samples}
    assert uuids[("gpu-01", "0")] == by_name["gpu-01"]["gpus"][0]["uuid"]  # joins with dcgm-exporter's UUID
    nodes = {s.labels["host"]: s.labels["Hostname"] for s in fams["kvaudit_kv_tokens"].samples}
    assert nodes["gpu-01"] == by_name["gpu-01"]["host"]["host"] and nodes["gpu-01"]  # and its Hostname: the node's own
    assert {s.labels["invocation"] for f in fams.values() for s in f.samples if "invocation" in s.labels} == {
        "fleet:inventory"}
    up = {s.labels["host"]: s.value for s in fams["kvaudit_host_up"].samples}
    assert up[f"gpu-{DOWN:02d}"] == 0 and up["gpu-01"] == 1 and sum(up.values()) == 18
    tokens = {(s.labels["host"], s.labels["gpu"]): s.value for s in fams["kvaudit_kv_tokens"].samples}
    assert tokens[("gpu-01", "7")] == 159277 and tokens[("gpu-05", "0")] == 105531
    kv = {(s.labels["host"], s.labels["gpu"]): s.value for s in fams["kvaudit_kv_cache_bytes"].samples}
    gpu0 = by_name["gpu-01"]["ranks"][0]
    assert kv[("gpu-01", "0")] == round(gpu0["kv_gib"] * 2**30)
    free = {(s.labels["host"], s.labels["gpu"]): s.value for s in fams["kvaudit_gpu_free_bytes"].samples}
    assert free[("gpu-01", "3")] == round(by_name["gpu-01"]["gpus"][3]["free_gib"] * 2**30)
    assert "kvaudit_last_run_timestamp_seconds" in fams and "kvaudit_run_duration_seconds" in fams

    # the HTML report opens and holds the fleet
    class Collect(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.text, self.bars = [], 0

        def handle_starttag(self, tag, attrs):
            if dict(attrs).get("class") == "bar":
                self.bars += 1

        def handle_data(self, data):
            self.text.append(data)

    page = Collect()
    page.feed((root / "report.html").read_text())
    body = " ".join(page.text)
    assert all(f"gpu-{i:02d}" in body for i in range(1, N + 1))
    assert "failed:host_key" in body and "RESERVE_EXPLAINS_FREE" in body
    # one bar per audited GPU, identical neighbours sharing one ("0–4 (5)"): 12 Kimi hosts (8 GPUs), 3 Qwen, vLLM, TRT;
    # the hung host's bars are its log's 8 ranks (no readings), TP1–TP2 and TP6–TP7 sharing one each: 6
    import re

    shared = sum(int(k) - 1 for k in re.findall(r"\d+–\d+ \((\d+)\)", body))
    assert page.bars + shared == 12 * 8 + 3 + 1 + 1 + 6

    import pandas as pd

    df = pd.read_csv(root / "gpus.csv")
    audited = df[~df.status.str.startswith("failed")]
    assert len(audited) == 12 * 8 + 3 + 1 + 1 + 8  # the hung host: a row per rank of its log, saying why no readings
    hung = df[df.host == f"gpu-{HANGS:02d}"]
    assert len(hung) == 8 and hung.why.str.contains("no answer within").all()
    failed = df[df.status.str.startswith("failed")]  # a host not audited is a row too, saying why
    assert set(failed.host) == {f"gpu-{i:02d}" for i in (DOWN, CHANGED)} and failed.why.notna().all()
    assert set(df[df.host == "gpu-07"].kv_tokens) == {702800}
    assert set(df[df.host == "gpu-01"].kv_tokens) == {159277}
    assert set(df[df.host == f"gpu-{TRT:02d}"].kv_tokens) == {446208}


def test_second_run_shows_drift_only_where_the_journal_changed(fleet):
    root, hosts = fleet
    changed = hosts[16]  # gpu-17: an engine upgrade, a smaller pool
    log = (KIMI_LOG.read_bytes().replace(b"#tokens: 159277", b"#tokens: 133500")
           .replace(b"max_total_num_tokens=159277", b"max_total_num_tokens=133500")
           .replace(b"/models/moonshotai/Kimi-K2.5", str(changed.model_dir).encode()))
    hostsim.write_journal(changed.root / "journal-new", hostsim.export_entries(
        log.rstrip(b"\n").split(b"\n"), "sglang.service", "f" * 32, 50000, 1_780_000_000_000_000))
    (changed.root / "journal-new" / "remote.journal").rename(changed.journal / "remote-new.journal")
    r, _ = run_fleet(root)
    d = r.json()
    assert d["run"]["previous_run_id"] is not None
    failing = [x for x in d["drift"] if x["what"] == "failing"]
    # the two broken hosts failed in both runs: said once each, as failing since the first run
    assert sorted((x["host"], x["after"]) for x in failing) == [(f"gpu-{i:02d}", 2) for i in (DOWN, CHANGED)]
    assert all("failing since run" in x["message"] for x in failing)
    drift = [x for x in d["drift"] if (x["what"] != "status" or x["before"] is not None) and x["what"] != "failing"]
    assert {x["host"] for x in drift} == {"gpu-17"}, drift
    assert d["run"]["first_run"] is False
    (restart,) = [x for x in drift if x["what"] == "restart"]  # a new invocation of the unit: a restart
    assert restart["after"] == "invocation " + "f" * 32 and "restarted since the last run" in restart["message"]
    tok = next(x for x in drift if x["what"] == "tokens")
    assert (tok["before"], tok["after"]) == (159277, 133500)
    assert "gpu-17: KV tokens fell from 159,277 to 133,500" in tok["message"]
    h = cli_process("history", "gpu-17", "--history", root / "history.sqlite", "--format", "json").json()
    assert [x["tokens"] for x in h["runs"]][-2:] == [159277, 133500]
