"""Issue 39, item 8: the shipped DaemonSet's own command (contrib/kubernetes/daemonset.yaml) on 8 pods with 64 MiB
logs each, against the loopback Kubernetes API (tests/kubesim.py), stays under the 384 MiB memory limit the
DaemonSet sets. Each pod's log is scanned as it streams in, never held whole (kvaudit.collect.kube)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import KIMI_LOG, ROOT
from tests.kubesim import FakePod, api_server, kubeconfig, pod_log

SGLANG = ("sglang", "lmsysorg/sglang:v0.5.9-cu129", 30000)
TIME = Path("/usr/bin/time")


def _limit_mib(container: dict) -> int:
    limit = container["resources"]["limits"]["memory"]
    m = re.fullmatch(r"(\d+)Mi", limit)
    assert m, limit
    return int(m.group(1))


@pytest.mark.skipif(not TIME.exists(), reason="GNU time (/usr/bin/time -v) measures the command's own peak")
def test_the_daemonsets_command_on_8_pods_of_64_mib_stays_under_its_limit(tmp_path):
    """Measured with GNU time (the command's own maximum resident set; a parent process's getrusage counts the
    pre-exec copy of the test's own memory): 647 MiB before (each pod's 64 MiB log read whole, then scanned),
    176 MiB after; a flood of anchor lines instead of serving lines: 719 -> 249 MiB."""
    ds = yaml.safe_load((ROOT / "contrib" / "kubernetes" / "daemonset.yaml").read_text())
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    script = container["args"][0]
    line = script[script.index("kvaudit fleet ") + len("kvaudit "):script.index(">")]
    argv = shlex.split(line.replace('"$NODE_NAME"', "gpu-node-1").replace("/textfile", str(tmp_path)))
    serving = "".join(
        f"2026-11-29T10:{i // 60 % 60:02d}:{i % 60:02d}.000000000Z [2026-11-29 10:00:00 TP0] Decode batch, "
        f"#running-req: 3, #token: 9120, token usage: 0.06, cuda graph: True, gen throughput (token/s): 211.4, "
        f"#queue-req: 0\n2026-11-29T10:00:00.000000000Z [2026-11-29 10:00:00] INFO:     10.0.0.7:51230 - "
        f"\"POST /v1/chat/completions HTTP/1.1\" 200 OK\n" for i in range(1000))
    head = pod_log(KIMI_LOG.read_text().splitlines())
    body = head + serving * ((64 << 20) // len(serving))
    assert len(body) >= 63 << 20
    pods = [FakePod("llm", f"kimi-{i}", [SGLANG], {("sglang", False): body},
                    labels={"app.kubernetes.io/component": "inference-server"}) for i in range(8)]
    with api_server(pods) as (url, _):
        cfg = kubeconfig(tmp_path / "cfg", url)
        r = subprocess.run([str(TIME), "-v", sys.executable, "-m", "kvaudit", *argv, "--kubeconfig", str(cfg)],
                           capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin",
                                                                             "HOME": str(tmp_path)})
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    prom = list(tmp_path.glob("*.prom"))
    assert prom and "kvaudit_" in prom[0].read_text(), (r.returncode, r.stderr[-2000:])
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    assert peak_kib < _limit_mib(container) * 1024, f"{peak_kib / 1024:.0f} MiB"
