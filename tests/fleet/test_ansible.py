"""kvaudit's own inventory reader against Ansible's: the same hosts, groups and variables as
``ansible-inventory -i FILE --list`` on a set of inventories (ansible-core is a test dependency), host ranges,
--limit patterns, kvaudit_* typos, become (issue 11, item 5)."""

from __future__ import annotations

import pytest

from kvaudit.fleet import inventory as inv
from tests.conftest import FIXTURES

INVENTORIES = sorted((FIXTURES / "inventories").iterdir())
needs_ansible = pytest.mark.skipif(inv._ansible_exe() is None, reason="ansible-core not installed (make test installs it)")


def _view(hosts):
    return {h.name: (h.target, frozenset(h.groups), dict(h.vars)) for h in hosts}


@needs_ansible
@pytest.mark.parametrize("path", INVENTORIES, ids=lambda p: p.name)
def test_own_reader_matches_ansible_inventory(path):
    ansible = inv.load(str(path), use_ansible=True)
    own = inv.load(str(path), use_ansible=False)
    assert _view(own) == _view(ansible)
    assert len(own) >= 6


def test_host_ranges_as_ansible_writes_them():
    assert inv.expand("gpu-[01:03]") == ["gpu-01", "gpu-02", "gpu-03"]
    assert inv.expand("n[a:c]") == ["na", "nb", "nc"]
    assert inv.expand("gpu-[1:9:4]") == ["gpu-1", "gpu-5", "gpu-9"]
    assert inv.expand("r[1:2]-g[0:1]") == ["r1-g0", "r1-g1", "r2-g0", "r2-g1"]
    with pytest.raises(inv.InventoryError, match="equal width"):
        inv.expand("gpu-[01:100]")


def test_limit_patterns_as_ansible_takes_them():
    hosts = inv.load(str(FIXTURES / "inventories" / "gpus.ini"), use_ansible=False)
    names = lambda limit: [h.name for h in inv.select(hosts, limit)]  # noqa: E731
    assert names("gpu-01,gpu-05") == ["gpu-01", "gpu-05"]
    assert names("gpu-h-*") == ["gpu-h-a", "gpu-h-b", "gpu-h-c"]
    assert names("h100") == ["gpu-03", "gpu-05", "gpu-07"]
    assert names("datacenter:!h100") == ["gpu-01", "gpu-02", "gpu-04", "gpu-h-a", "gpu-h-b", "gpu-h-c"]
    assert names("datacenter:&canary") == ["gpu-01", "gpu-07"]


def test_variables_kvaudit_reads(tmp_path):
    hosts = {h.name: h for h in inv.load(str(FIXTURES / "inventories" / "gpus.ini"), use_ansible=False)}
    # gpu-03 is in h200 (from the range, with its own ansible_user) and h100 (its own port and key file):
    # host variables win over every group's, from both lines
    assert hosts["gpu-03"].target == "ops@gpu-03:2222"
    assert hosts["gpu-03"].vars["ansible_ssh_private_key_file"] == "~/.ssh/fleet_ed25519"
    assert hosts["gpu-05"].target == "audit@gpu-05:22" and hosts["gpu-05"].setting("source") == "docker:sglang"
    assert hosts["gpu-07"].notes == ("ansible_become ignored: kvaudit only reads, as the login user",)
    # issue 24, item 6: SSH options given to Ansible's ssh are not applied, and said
    args = tmp_path / "args.ini"
    args.write_text("[gpus]\ngpu-1 ansible_ssh_common_args='-o ProxyCommand=\"ssh -W %h:%p bastion\"'\ngpu-2\n")
    got = {h.name: h for h in inv.load(str(args), use_ansible=False)}
    assert got["gpu-1"].notes == ("ansible_ssh_common_args not applied: kvaudit reads SSH options from ssh_config "
                                  "(--ssh-config); put them in a Host block there",)
    assert got["gpu-2"].notes == ()
    bad = tmp_path / "typo.ini"
    bad.write_text("[gpus]\ngpu-1 kvaudit_unti=sglang.service\n")
    with pytest.raises(inv.InventoryError, match="unknown setting 'kvaudit_unti'"):
        inv.load(str(bad), use_ansible=False)


def test_the_working_directory_ansible_cfg_loads_no_plugin(tmp_path, monkeypatch):
    """issue 21 item 4: an ansible.cfg in the working directory (a cloned repository) naming a vars plugin must not
    run that plugin's code inside kvaudit fleet: ansible-inventory gets an empty config of kvaudit's own and runs
    outside the working directory."""
    marker = tmp_path / "pwned"
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "evil.py").write_text(
        "from ansible.plugins.vars import BaseVarsPlugin\n"
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "class VarsModule(BaseVarsPlugin):\n"
        "    REQUIRES_ENABLED = False\n"
        "    def get_vars(self, loader, path, entities, cache=True):\n"
        "        return {}\n")
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\nvars_plugins = {plugins}\nvars_plugins_enabled = evil,host_group_vars\n")
    (tmp_path / "hosts.ini").write_text("[gpu]\nnode1 ansible_host=127.0.0.1\n")
    monkeypatch.chdir(tmp_path)
    hosts = inv.load("hosts.ini")
    assert [h.name for h in hosts] == ["node1"]
    assert not marker.exists()
