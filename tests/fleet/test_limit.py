"""Inventories as Ansible reads them (issue 37, item 7): --limit's subscripts, regexes, & and !, compared with
ansible-core's own ``ansible all --limit X --list-hosts``; ``kvaudit fleet --list-hosts``; hosts failing alike
said once, with their count; Ctrl-C's unfinished hosts counted as interrupted, not failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvaudit.collect.interface import Unreachable
from kvaudit.fleet import inventory as inv
from kvaudit.fleet.runner import Interrupted
from kvaudit.report.fleet import host_ranges, render_markdown, render_text
from kvaudit.results import FleetHost, FleetRun, HostAudit
from tests.conftest import cli_process

INVENTORY = """[sglang]
gpu-[1:9]

[vllm]
gpu-[10:12]
node-a

[h200]
gpu-[07:09]
gpu-3

[spares]
spare-[a:c]

[serving:children]
sglang
vllm
"""

#: patterns Ansible resolves to hosts: kvaudit must select exactly the same, in the same order
PATTERNS = ["sglang[0:3]", "sglang[1]", "sglang[-1]", "sglang[2:]", "sglang[0-2]", "vllm,sglang[-1]", "~gpu-1[0-9]",
            "~sgl", "~spare-[ab]", "all:!sglang", "serving:!vllm", "serving:&h200", "~gpu:&h200:!gpu-08",
            "gpu-1*", "gpu-0?", "*:!spare-*", "spares[1:]", "h200[0],vllm[1]", "node-a,spare-b", "serving[10]",
            "sglang:vllm:!~gpu-1.*"]

ANSIBLE = shutil.which("ansible", path=str(Path(sys.executable).parent)) or shutil.which("ansible")
needs_ansible = pytest.mark.skipif(ANSIBLE is None, reason="ansible-core not installed (make test installs it)")


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("limit") / "hosts.ini"
    p.write_text(INVENTORY)
    return p


def _ansible_list_hosts(inventory: Path, limit: str) -> tuple[int, str]:
    cfg = inventory.parent / "ansible.cfg"
    cfg.write_text("[defaults]\n")  # Ansible's defaults, not a configuration of the machine's
    env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_HOST_KEY_CHECKING": "False",
           "ANSIBLE_LOCAL_TEMP": str(inventory.parent / "ansible-tmp"), "ANSIBLE_HOME": str(inventory.parent)}
    p = subprocess.run([ANSIBLE, "all", "-i", str(inventory), "--limit", limit, "--list-hosts"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=inventory.parent)
    return p.returncode, p.stdout


def _names(listing: str) -> list[str]:
    return [line.strip() for line in listing.splitlines()[1:] if line.strip()]


@needs_ansible
@pytest.mark.parametrize("limit", PATTERNS)
def test_limit_selects_what_ansible_selects(inventory, limit):
    rc, out = _ansible_list_hosts(inventory, limit)
    assert rc == 0 and out.startswith("  hosts ("), out
    for use_ansible in (False, True):  # kvaudit's own reader, and Ansible's hosts read back
        got = [h.name for h in inv.load(str(inventory), limit, use_ansible=use_ansible)]
        # the same hosts; listed in the inventory's order (Ansible lists them in its group tree's order)
        assert sorted(got) == sorted(_names(out)) and len(got) == len(set(got)), (use_ansible, got)


@needs_ansible
def test_list_hosts_prints_what_ansible_prints(inventory):
    for limit in ("sglang[0:3]", "~gpu-1[0-9]:!gpu-11", "serving:&h200"):
        r = cli_process("fleet", inventory, "--limit", limit, "--list-hosts", "--no-config")
        theirs = _ansible_list_hosts(inventory, limit)[1]
        assert r.code == 0 and r.stdout.splitlines()[0] == theirs.splitlines()[0], (limit, r.stderr)
        assert sorted(r.stdout.splitlines()[1:]) == sorted(theirs.splitlines()[1:])


@needs_ansible
def test_a_range_in_limit_is_the_inventory_range(inventory):
    """``gpu-[2:7]``: Ansible reads a subscript of the pattern ``gpu-``, which names nothing, and stops; kvaudit
    reads it as the inventory's range (what the words mean in the inventory file): gpu-2..gpu-7."""
    rc, _ = _ansible_list_hosts(inventory, "gpu-[2:7]")
    assert rc != 0  # Ansible: no hosts
    hosts = inv.load(str(inventory), use_ansible=False)
    assert [h.name for h in inv.select(hosts, "gpu-[2:7]")] == [f"gpu-{i}" for i in range(2, 8)]
    assert [h.name for h in inv.select(hosts, "gpu-[07:09]:!gpu-08")] == ["gpu-07", "gpu-09"]
    assert [h.name for h in inv.select(hosts, "sglang:&gpu-[2:7]:!gpu-[4:5]")] == ["gpu-2", "gpu-3", "gpu-6",
                                                                                  "gpu-7"]


def test_limit_errors_are_one_line(inventory):
    r = cli_process("fleet", inventory, "--limit", "~gpu-(", "--list-hosts", "--no-config")
    assert r.code == 2 and "not a regular expression" in r.stderr and "Traceback" not in r.stderr
    r = cli_process("fleet", inventory, "--limit", "nosuch", "--list-hosts", "--no-config")
    assert r.code == 2 and "names no hosts matching 'nosuch'" in r.stderr


# --- the report of a fleet that fails alike ----------------------------------------------------------------

def _run(results, interrupted=False) -> FleetRun:
    return FleetRun("2026-12-02T06:00:00+00:00", 0.0, 12.5, 8, tuple(results), False, interrupted)


def _refused(name: str) -> tuple[FleetHost, HostAudit]:
    return (FleetHost(name, f"root@{name}"), HostAudit(
        f"root@{name}", None, None, (), (), Unreachable(f"root@{name}: connection refused (10.0.{name[-2:]}.1:22)")))


def test_sixty_four_hosts_failing_alike_are_one_line():
    run = _run([_refused(f"gpu-{i:02d}") for i in range(1, 65)] + [_refused("odd-host")])
    text = render_text(run, width=120)
    lines = text.splitlines()
    assert lines[0].startswith("kvaudit fleet: 65 failed - 65 hosts")
    assert sum("gpu-" in line for line in lines) == 2  # one table row and one "Not audited" line
    assert "  gpu-[01:64] (64)" in text
    assert "64 hosts (gpu-[01:64]): unreachable: connection refused (ADDRESS)" in text
    assert "odd-host: unreachable: root@odd-host: connection refused (10.0.st.1:22)" in text  # a cause of its own
    assert len(lines) < 12, text
    md = render_markdown(run)
    assert sum(line.startswith("- **64 hosts** (gpu-") and line.endswith("(unreachable): connection refused (ADDRESS)")
               for line in md.splitlines()) == 1


def test_ctrl_c_counts_hosts_not_reached_as_interrupted():
    done = _refused("gpu-01")
    stopped = [(FleetHost(f"gpu-{i:02d}", f"gpu-{i:02d}"),
                HostAudit(f"gpu-{i:02d}", None, None, (), (), Interrupted(f"gpu-{i:02d}: interrupted (Ctrl-C)")))
               for i in range(2, 11)]
    text = render_text(_run([done, *stopped], interrupted=True), width=120)
    assert text.splitlines()[0].startswith("kvaudit fleet: 1 failed, 9 interrupted - 10 hosts")
    assert "9 hosts (gpu-[02:10]): interrupted: Ctrl-C before it finished" in text
    assert "failed:interrupted" not in text


def test_host_ranges():
    assert host_ranges(["gpu-01", "gpu-02", "gpu-03", "gpu-07", "x", "gpu-10", "gpu-11"]) == \
        "gpu-[01:03], gpu-07, x, gpu-[10:11]"
    assert host_ranges(["n9", "n10", "n11", "n13"]) == "n[9:11], n13"  # Ansible's n[9:11] is n9 n10 n11
    assert host_ranges([f"h{i}" for i in range(0, 20, 2)], most=3) == "h0, h2, h4 and 7 more"


def test_ctrl_c_on_a_real_run_says_interrupted_in_the_text_report(tmp_path):
    """A real fleet run over real servers, one worker: Ctrl-C while the third host is in flight; the report counts
    the two unfinished hosts as interrupted, in one line, not as failures."""
    import signal

    from tests.endpointsim import json_doc, serve
    from tests.fleet.test_fleet_control import KIMI_INFO, _kvaudit, silent_server

    with serve({"/server_info": json_doc(KIMI_INFO)}) as (fast, _), silent_server() as (slow, arrived):
        inv_file = tmp_path / "servers.txt"
        inv_file.write_text(f"{fast}\n{fast}/a\n{slow}\n{slow}/b\n")
        p = _kvaudit("fleet", inv_file, "--parallel", "1", "--timeout", "60", "--no-config")
        assert arrived.wait(60)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    assert out.splitlines()[0].startswith("kvaudit fleet: 2 partial, 2 interrupted - 4 hosts"), out
    said = " ".join(out.split())  # the report wraps at the terminal's width
    assert f"2 hosts ({slow}, {slow}/b): interrupted: Ctrl-C before it finished" in said
    assert "failed" not in out
