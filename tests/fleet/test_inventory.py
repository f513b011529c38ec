"""Inventories (plain, Ansible INI and YAML, ssh_config patterns) and kvaudit.toml precedence."""

from __future__ import annotations

import pytest

from kvaudit.fleet import inventory as inv
from kvaudit.fleet import settings

INI = """
# production GPU hosts
[sglang]
gpu-01 ansible_host=10.0.0.1 ansible_user=ops ansible_port=2222
gpu-02 ansible_host=10.0.0.2 kvaudit_unit=sglang-kimi.service

[vllm]
gpu-03

[gpus:children]
sglang
vllm

[gpus:vars]
ansible_user=root
kvaudit_journal_directory=/var/log/journal-remote
"""

YAML = """
all:
  vars:
    ansible_user: root
  children:
    sglang:
      hosts:
        gpu-01:
          ansible_host: 10.0.0.1
          ansible_port: 2222
        gpu-02:
    vllm:
      hosts:
        gpu-03:
          ansible_user: admin
"""


def test_ansible_ini_groups_children_and_vars(tmp_path):
    p = tmp_path / "hosts.ini"
    p.write_text(INI)
    hosts = {h.name: h for h in inv.load(str(p))}
    assert hosts["gpu-01"].target == "ops@10.0.0.1:2222"  # host vars beat group vars
    assert hosts["gpu-02"].target == "root@10.0.0.2" and hosts["gpu-02"].setting("unit") == "sglang-kimi.service"
    assert hosts["gpu-03"].target == "root@gpu-03"
    assert hosts["gpu-03"].setting("journal_directory") == "/var/log/journal-remote"
    assert set(hosts["gpu-01"].groups) == {"gpus", "sglang"}
    assert [h.name for h in inv.load(str(p), "vllm")] == ["gpu-03"]
    assert [h.name for h in inv.load(str(p), "gpu-0[12]")] == ["gpu-01", "gpu-02"]


def test_ansible_yaml(tmp_path):
    p = tmp_path / "hosts.yml"
    p.write_text(YAML)
    hosts = {h.name: h for h in inv.load(str(p))}
    assert hosts["gpu-01"].target == "root@10.0.0.1:2222"
    assert hosts["gpu-02"].target == "root@gpu-02"
    assert hosts["gpu-03"].target == "admin@gpu-03"


def test_plain_hosts_file(tmp_path):
    p = tmp_path / "hosts.txt"
    p.write_text("# one per line\nroot@gpu-01:2222\ngpu-02   # an alias\n\ngpu-03 kvaudit_source=docker:sglang\n")
    hosts = inv.load(str(p))
    assert [(h.name, h.target) for h in hosts] == [("root@gpu-01:2222", "root@gpu-01:2222"), ("gpu-02", "gpu-02"),
                                                   ("gpu-03", "gpu-03")]
    assert hosts[2].setting("source") == "docker:sglang"


def test_ssh_config_aliases(tmp_path):
    p = tmp_path / "ssh_config"
    p.write_text("Host gpu-*\n  User root\nHost gpu-a gpu-b bastion\n  HostName 10.0.0.9\nHost gpu-c\n")
    assert [h.name for h in inv.from_ssh_config(str(p), "gpu-*")] == ["gpu-a", "gpu-b", "gpu-c"]
    with pytest.raises(inv.InventoryError, match="matches"):
        inv.from_ssh_config(str(p), "db-*")


@pytest.mark.parametrize("text,message", [("", "no hosts"), ("all:\n  - a\n", "mapping"), ("[g]\nx='\n", "x.ini:2: No closing quotation")])
def test_bad_inventories(tmp_path, text, message):
    p = tmp_path / ("x.yml" if text.startswith("all") else "x.ini")
    p.write_text(text)
    with pytest.raises(inv.InventoryError, match=message):
        inv.load(str(p))


def test_settings_precedence(tmp_path):
    p = tmp_path / "kvaudit.toml"
    p.write_text('[fleet]\nparallel = 4\ntimeout = 30\nunit = "sglang.service"\n\n[thresholds]\nunused_fraction = 0.1\n')
    file, _ = settings.load(str(p))
    assert (file.parallel, file.timeout, file.unit, file.thresholds) == (4, 30, "sglang.service", {"unused_fraction": 0.1})
    merged = settings.merge(file, parallel=16, timeout=None, unit=None)
    assert (merged.parallel, merged.timeout, merged.unit) == (16, 30, "sglang.service")  # flag > file > default
    assert settings.merge(settings.FleetSettings()).parallel == 8
    p.write_text("[fleet]\nparalel = 4\n")
    with pytest.raises(settings.SettingsError, match="unknown setting 'paralel'"):
        settings.load(str(p))


def test_csv_cells_from_hosts_never_become_formulas(tmp_path):
    """A host name that a spreadsheet would evaluate (`=...`, `@...`, `-...`) lands in the CSV as text."""
    import csv

    from kvaudit.check import CheckOptions, check
    from kvaudit.reconcile.interface import AuditOptions
    from kvaudit.report import table_export
    from tests.collect.conftest import CAPTURE

    h = check(str(CAPTURE), CheckOptions(audit=AuditOptions()))
    out = tmp_path / "gpus.csv"
    names = ['=HYPERLINK("http://x","y")', "@SUM(1+1)", "-2+3", "+cmd"]
    assert table_export.write([(n, h) for n in names], str(out)) == 8 * len(names)
    rows = list(csv.DictReader(out.open()))
    assert {r["host"] for r in rows} == {"'" + n for n in names}
    assert not any(v[:1] in ("=", "+", "@") for r in rows for v in r.values())


def test_a_host_range_bomb_is_refused_before_it_is_expanded(tmp_path):
    """issue 21: a 28-byte line naming 10^8 hosts is refused by count, in kvaudit's words, before anything is
    expanded. Run under a 1.5 GiB address-space cap: expanding it would die of MemoryError there instead."""
    import subprocess
    import sys

    p = tmp_path / "bomb.ini"
    p.write_text("[g]\nh[0:999][0:999][0:99]\n")
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))\n"
            "from kvaudit.fleet import inventory as inv\n"
            "try:\n    inv.load(%r)\nexcept inv.InventoryError as e:\n    print('refused:', e)\n" % str(p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "KVAUDIT_NO_ANSIBLE": "1"})
    assert "refused:" in r.stdout and "names more than 10,000 hosts" in r.stdout, r.stderr[-500:]
    assert len(inv.expand("gpu-[01:64]")) == 64


def test_a_host_name_with_a_bidi_override_is_reported_without_it(tmp_path, monkeypatch):
    """issue 21: U+202E in an inventory name would show the name reversed in every report; the name loses it
    (and says so), the SSH target is left as written."""
    monkeypatch.setenv("KVAUDIT_NO_ANSIBLE", "1")
    p = tmp_path / "hosts.txt"
    p.write_text("gpu\u202e-7\nplain-1\n", encoding="utf-8")
    a, b = inv.load(str(p))
    assert a.name == "gpu-7" and "\u202e" in a.target and any("invisible" in n for n in a.notes)
    assert b.name == "plain-1" and not b.notes


@pytest.mark.parametrize("text", [
    # "billion laughs": 9 levels of 9 aliases, 387 million strings from ~400 bytes
    "all:\n  vars:\n    a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"    {n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    + "  hosts:\n    gpu-1:\n",
    "all: &x\n  children:\n    g: *x\n",  # an alias to its own enclosing mapping
])
def test_a_yaml_alias_bomb_is_refused_before_it_is_walked(tmp_path, text):
    """issue 21: aliases are counted over the shared structure in linear time and a document that expands past
    200,000 values (or into itself) is refused in kvaudit's words; the same check under a 1.5 GiB cap and a
    timeout in a child process, so without it the test ends instead of eating the machine."""
    import os
    import subprocess
    import sys

    p = tmp_path / "bomb.yml"
    p.write_text(text)
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))\n"
            "from kvaudit.fleet import inventory as inv\n"
            "try:\n    inv.load(%r)\nexcept inv.InventoryError as e:\n    print('refused:', e)\n" % str(p))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KVAUDIT_NO_ANSIBLE": "1"})
    assert "refused:" in r.stdout and "200,000 values" in r.stdout, (r.stdout, r.stderr[-300:])
