"""Inventories: a plain hosts file, an Ansible inventory (INI or YAML), or ssh_config aliases matching a
pattern. Per-host settings ride along as variables: ``ansible_host``/``ansible_user``/``ansible_port``
build the SSH target; ``kvaudit_unit``, ``kvaudit_source``, ``kvaudit_journal_directory`` override the
run's defaults for that host (a host whose journal is kept elsewhere, a docker-run engine...)."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


class InventoryError(Exception):
    pass


@dataclass(frozen=True)
class FleetHost:
    name: str  # how reports name it
    target: str  # what SSH connects to: user@host:port, or an ssh_config alias
    groups: tuple[str, ...] = ()
    vars: dict[str, str] = field(default_factory=dict)

    def setting(self, key: str) -> str | None:
        v = self.vars.get(f"kvaudit_{key}")
        return str(v) if v is not None else None


def _target(name: str, v: dict[str, str]) -> str:
    host = v.get("ansible_host") or name
    user = v.get("ansible_user")
    port = v.get("ansible_port")
    t = f"{user}@{host}" if user else host
    return f"{t}:{port}" if port else t


def _kv(tokens: list[str]) -> dict[str, str]:
    out = {}
    for t in tokens:
        k, sep, v = t.partition("=")
        if sep:
            out[k] = v
    return out


def load(path: str, limit: str | None = None) -> list[FleetHost]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"cannot read inventory {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InventoryError(f"inventory {path} is not text") from None
    if p.suffix in (".yml", ".yaml") or re.match(r"^\s*(all|[\w-]+)\s*:\s*$", text, re.M) and "[" not in text.split("\n", 1)[0]:
        hosts = _yaml(text, path)
    elif re.search(r"^\s*\[[^\]]+\]\s*$", text, re.M):
        hosts = _ini(text, path)
    else:
        hosts = _plain(text)
    if limit:
        hosts = [h for h in hosts if fnmatch.fnmatchcase(h.name, limit) or limit in h.groups]
    seen: dict[str, FleetHost] = {}
    for h in hosts:
        seen.setdefault(h.name, h)
    if not seen:
        raise InventoryError(f"inventory {path} names no hosts" + (f" matching {limit!r}" if limit else ""))
    return list(seen.values())


def _plain(text: str) -> list[FleetHost]:
    """One target per line (user@host[:port] or an alias), optional key=value settings after it; # comments."""
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = shlex.split(line)
        name = tokens[0]
        if len(tokens) > 2 and tokens[1] in ("-l", "--selector"):  # k8s:NAMESPACE -l SELECTOR: a pod group
            name, tokens = f"{tokens[0]} -l {tokens[2]}", [tokens[0], f"kvaudit_selector={tokens[2]}", *tokens[3:]]
        v = _kv(tokens[1:])
        out.append(FleetHost(name, _target(tokens[0], v) if "ansible_host" in v else tokens[0], (), v))
    return out


#: the labels that make several pods one server: a LeaderWorkerSet group (leader + workers)
GROUP_LABELS = ("leaderworkerset.sigs.k8s.io/name", "leaderworkerset.sigs.k8s.io/group-index")


def from_kubernetes(target: str, selector: str | None, kubeconfig: str | None, timeout_s: float) -> list[FleetHost]:
    """``fleet k8s:NAMESPACE -l SELECTOR``: the servers among the pods the selector matches. The pods of one
    LeaderWorkerSet group are one server (audited together, ranks merged); every other pod is its own."""
    from kvaudit.collect.interface import CollectError
    from kvaudit.collect.kube import KubeReader, parse_target

    try:
        t = parse_target(target, selector)
    except ValueError as exc:
        raise InventoryError(str(exc)) from None
    if t.pod:
        return [FleetHost(str(t), str(t))]
    try:
        pods = KubeReader(kubeconfig, timeout_s).pods(t.namespace, t.selector or "")
    except CollectError as exc:
        raise InventoryError(f"cannot list the pods of {t}: {exc}") from None
    hosts: dict[str, FleetHost] = {}
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        labels = pod.metadata.labels or {}
        if all(k in labels for k in GROUP_LABELS):
            sel = ",".join(f"{k}={labels[k]}" for k in GROUP_LABELS)
            name = f"k8s:{t.namespace} -l {sel}"
            hosts.setdefault(name, FleetHost(name, f"k8s:{t.namespace}", (), {"kvaudit_selector": sel}))
        else:
            name = f"k8s:{t.namespace}/{pod.metadata.name}"
            hosts[name] = FleetHost(name, name)
    if not hosts:
        raise InventoryError(f"no pod in namespace {t.namespace} matches -l {t.selector}")
    return list(hosts.values())


def _ini(text: str, path: str) -> list[FleetHost]:
    groups: dict[str, list[tuple[str, dict[str, str]]]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    children: dict[str, list[str]] = {}
    section, kind = "ungrouped", "hosts"
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(";", 1)[0].strip() if raw.lstrip().startswith(";") else raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([^\]:]+)(?::(vars|children))?\]", line)
        if m:
            section, kind = m.group(1), m.group(2) or "hosts"
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as exc:
            raise InventoryError(f"{path}:{n}: {exc}") from None
        if not tokens:
            continue
        if kind == "vars":
            group_vars.setdefault(section, {}).update(_kv(tokens))
        elif kind == "children":
            children.setdefault(section, []).append(tokens[0])
        else:
            groups.setdefault(section, []).append((tokens[0], _kv(tokens[1:])))
    return _flatten(groups, group_vars, children)


def _flatten(groups, group_vars, children) -> list[FleetHost]:
    def ancestors(g: str, seen=()) -> list[str]:
        out = []
        for parent, kids in children.items():
            if g in kids and parent not in seen:
                out += [parent] + ancestors(parent, seen + (parent,))
        return out

    out = []
    for g, members in groups.items():
        for name, hv in members:
            chain = ["all"] + list(reversed(ancestors(g))) + [g]
            v: dict[str, str] = {}
            for grp in chain:
                v.update({k: str(x) for k, x in group_vars.get(grp, {}).items()})
            v.update({k: str(x) for k, x in hv.items()})
            out.append(FleetHost(name, _target(name, v), tuple(x for x in chain if x != "all"), v))
    return out


def _yaml(text: str, path: str) -> list[FleetHost]:
    try:
        import yaml
    except ImportError:  # pragma: no cover - a dependency
        raise InventoryError("reading a YAML inventory needs PyYAML") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise InventoryError(f"{path}: a YAML inventory is a mapping of groups")
    groups: dict[str, list[tuple[str, dict[str, str]]]] = {}
    group_vars: dict[str, dict[str, str]] = {}
    children: dict[str, list[str]] = {}

    def walk(name: str, node) -> None:
        node = node or {}
        if not isinstance(node, dict):
            raise InventoryError(f"{path}: group {name!r} is not a mapping")
        for h, hv in (node.get("hosts") or {}).items():
            groups.setdefault(name, []).append((str(h), {k: str(x) for k, x in (hv or {}).items()}))
        if node.get("vars"):
            group_vars[name] = {k: str(x) for k, x in node["vars"].items()}
        for child, cnode in (node.get("children") or {}).items():
            children.setdefault(name, []).append(child)
            walk(child, cnode)

    for name, node in doc.items():
        walk(str(name), node)
    return _flatten(groups, group_vars, children)


def from_ssh_config(ssh_config: str, pattern: str) -> list[FleetHost]:
    """The concrete ``Host`` aliases of an ssh_config (no wildcards) that match ``pattern``."""
    try:
        text = Path(ssh_config).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"cannot read ssh config {ssh_config}: {exc.strerror or exc}") from None
    names = []
    for line in text.splitlines():
        m = re.match(r"\s*Host\s+(.+)$", line, re.I)
        if m:
            names += [n for n in m.group(1).split() if not any(c in n for c in "*?!")]
    hosts = [FleetHost(n, n) for n in dict.fromkeys(names) if fnmatch.fnmatchcase(n, pattern)]
    if not hosts:
        raise InventoryError(f"no Host alias in {ssh_config} matches {pattern!r}")
    return hosts
