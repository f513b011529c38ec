"""Inventories: a plain hosts file, an Ansible inventory (INI or YAML), or ssh_config aliases matching a
pattern. Per-host settings ride along as variables: ``ansible_host``/``ansible_user``/``ansible_port`` (and
their ``ansible_ssh_*`` spellings) build the SSH target, ``ansible_ssh_private_key_file`` adds the key;
``kvaudit_unit``, ``kvaudit_source``, ``kvaudit_journal_directory``, ``kvaudit_selector``,
``kvaudit_kubeconfig`` override the run's defaults for that host (a typo in a ``kvaudit_`` name is an error,
as in kvaudit.toml); ``ansible_become*`` is ignored (kvaudit only reads) and said.

Ansible inventories are read with ``ansible-inventory -i FILE --list`` when Ansible is installed (what Ansible
itself resolves: ranges, group_vars precedence, plugins limited to ini and yaml), else with kvaudit's own
reader, which a test holds to the same hosts, groups and variables on a set of inventories. Host ranges
(``gpu-[01:64]``, ``[a:c]``, ``[1:9:2]``) and ``--limit`` patterns are Ansible's (``a,b``, ``gpu-*``,
groups, ``sglang[0:3]``, ``~REGEX``, ``!excluded``, ``&required``: :func:`select`), plus ``gpu-[2:7]`` as the
inventory range where Ansible would select nothing."""

from __future__ import annotations

from kvaudit.errors import KvauditError
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from kvaudit.results import FleetHost
from kvaudit.textsafe import printable


class InventoryError(KvauditError):
    pass


#: the kvaudit_* host variables kvaudit reads; any other kvaudit_ name is a typo
HOST_SETTINGS = ("unit", "source", "journal_directory", "selector", "kubeconfig", "model_config")


def _target(name: str, v: dict[str, str]) -> str:
    host = v.get("ansible_host") or v.get("ansible_ssh_host") or name
    user = v.get("ansible_user") or v.get("ansible_ssh_user")
    port = v.get("ansible_port") or v.get("ansible_ssh_port")
    t = f"{user}@{host}" if user else host
    return f"{t}:{port}" if port else t


def _kv(tokens: list[str]) -> dict[str, str]:
    out = {}
    for t in tokens:
        k, sep, v = t.partition("=")
        if sep:
            out[k] = v
    return out


def kind(path: str, text: str) -> str:
    """``yaml``, ``ini`` (Ansible inventories) or ``plain`` (one target per line)."""
    if Path(path).suffix in (".yml", ".yaml") or re.match(r"^\s*(all|[\w-]+)\s*:\s*$", text, re.M) and \
            "[" not in text.split("\n", 1)[0]:
        return "yaml"
    if re.search(r"^\s*\[[^\]]+\]\s*$", text, re.M):
        return "ini"
    return "plain"


#: an inventory file larger than this is not an inventory (a regular file only: a FIFO would block)
MAX_INVENTORY_BYTES = 16 << 20
#: the most hosts one inventory may name, its host ranges counted before anything (kvaudit's reader or
#: ansible-inventory) expands them: 1,000 lines of ``h1-[0:9999]`` are 14 KB and ten million names
MAX_INVENTORY_HOSTS = 20_000


def load(path: str, limit: str | None = None, use_ansible: bool = True, timeout: float = 120.0
         ) -> list[FleetHost]:
    """The hosts of an inventory file; ``timeout``: the most seconds ansible-inventory may take (the run's
    deadline, when shorter than its own 120 s)."""
    from kvaudit.safefile import read_regular

    raw = read_regular(path, MAX_INVENTORY_BYTES, "inventory", InventoryError)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InventoryError(f"inventory {path} is not text") from None
    named = _ranges_named(text)
    if named > MAX_INVENTORY_HOSTS:
        raise InventoryError(f"inventory {path}: its host ranges name more than {MAX_INVENTORY_HOSTS:,} hosts: "
                             "refused before expanding them (split the fleet into several inventories)")
    k = kind(path, text)
    if k == "plain":
        hosts = _plain(text)
    else:
        own = (lambda: _yaml(text, path)) if k == "yaml" else (lambda: _ini(text, path))
        try:
            hosts = (ansible_inventory(path, timeout) if use_ansible else None) or own()
        except InventoryError as ansible_says:
            own()  # kvaudit's reader names the line when it can; else Ansible's own words stand
            raise ansible_says
    group_hosts = getattr(hosts, "group_hosts", None)
    hosts = [_checked(h, path) for h in _merged(hosts)]
    if limit:
        hosts = select(hosts, limit, group_hosts)
    if not hosts:
        raise InventoryError(f"inventory {path} names no hosts" + (f" matching {limit!r}" if limit else ""))
    return hosts


def _merged(hosts: list[FleetHost]) -> list[FleetHost]:
    """One entry per host name (a host listed in several groups): groups united, in order."""
    seen: dict[str, FleetHost] = {}
    for h in hosts:
        if h.name in seen:
            first = seen[h.name]
            seen[h.name] = replace(first, groups=tuple(dict.fromkeys(first.groups + h.groups)))
        else:
            seen[h.name] = h
    return list(seen.values())


def _checked(h: FleetHost, path: str) -> FleetHost:
    """kvaudit_* typos are errors; become is ignored, and said; the key file becomes a setting."""
    bad = sorted(k for k in h.vars if k.startswith("kvaudit_") and k[8:] not in HOST_SETTINGS)
    if bad:
        raise InventoryError(f"{path}: host {h.name}: unknown setting {bad[0]!r} (known: "
                             + ", ".join(f"kvaudit_{k}" for k in HOST_SETTINGS) + ")")
    notes = h.notes
    shown = printable(h.name)
    if shown != h.name:
        # a bidi override shows "gpu-7" reversed, a zero-width space hides which host it is: reports name the host
        # without them (the SSH target is left as written)
        notes += ("control or invisible characters removed from the host's name",)
        h = replace(h, name=shown or "?")
    if any(k.startswith("ansible_become") and str(v).lower() not in ("false", "no", "0", "")
           for k, v in h.vars.items()):
        notes += ("ansible_become ignored: kvaudit only reads, as the login user",)
    # SSH options Ansible passes on its ssh command line: kvaudit connects with its own client and reads the
    # options from ssh_config, so these are not applied, and the report says so (a ProxyCommand given only here
    # would otherwise be silently missing)
    extra = sorted(k for k in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
                   if str(h.vars.get(k) or "").strip())
    if extra:
        notes += (f"{', '.join(extra)} not applied: kvaudit reads SSH options from ssh_config (--ssh-config); "
                  "put them in a Host block there",)
    return replace(h, notes=notes)


#: Ansible's subscript on a pattern (ansible-core inventory/manager.py ``PATTERN_WITH_SUBSCRIPT``): ``grp[1]``,
#: ``grp[-1]``, ``grp[0:3]`` (both ends included), ``grp[2:]``; ``[x-y]`` is the removed old spelling
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]+)?)\]$")


class Hosts(list):
    """An inventory's hosts, and each group's hosts in the group's own order (Ansible's ``Group.get_hosts``: its
    own hosts as listed, then its children's, level by level), which a subscript (``sglang[0:3]``) counts in."""

    group_hosts: dict[str, list[str]]


def group_order(members: dict[str, list[str]], children: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each group's hosts as ansible-core's ``Group.get_hosts`` lists them: the group's own, then each level of
    its descendants' (``get_descendants(preserve_ordering=True)``), each host once."""
    out: dict[str, list[str]] = {}
    for g in dict.fromkeys([*members, *children]):
        level, seen, kids = [g], {g}, [g]
        while level:
            nxt = [c for x in level for c in children.get(x, []) if c not in seen]
            nxt = list(dict.fromkeys(nxt))
            seen.update(nxt)
            kids += nxt
            level = nxt
        out[g] = list(dict.fromkeys(h for k in kids for h in members.get(k, [])))
    return out


def _one_pattern(hosts: list[FleetHost], pat: str, group_hosts: dict[str, list[str]] | None = None
                 ) -> list[FleetHost]:
    """The hosts one pattern names, in inventory order, as ansible-core's ``_match_one_pattern`` reads it: a group
    (its hosts) or a host, by name or glob (``fnmatch``, case-sensitive); ``~REGEX`` matched at the start of a
    group's or host's name; ``all`` and ``*``; then a subscript picks from that list. Where Ansible would select
    nothing because the part before ``[`` names no group or host (``gpu-[2:7]``: Ansible reads a subscript of a
    pattern ``gpu-``), kvaudit reads the whole pattern as an inventory's host range (gpu-2..gpu-7), or as a glob
    (``gpu-0[12]``)."""
    m = None if pat.startswith("~") else _SUBSCRIPT.match(pat)  # a regex's brackets are its own (Ansible's too)
    if m:
        base = _one_pattern(hosts, m.group(1), group_hosts)
        if base:
            if m.group(2) is not None:  # one index, negative from the end
                i = int(m.group(2))
                return [base[i]] if -len(base) <= i < len(base) else []
            start, end = int(m.group(3)), (int(m.group(5)) if m.group(5) else len(base) - 1)
            return base[start:end + 1]
        if _RANGE.search(pat):
            wanted = set(expand(pat))
            return [h for h in hosts if h.name in wanted]
        return _glob(hosts, pat)  # gpu-0[12]: Ansible's subscript of nothing; kvaudit reads fnmatch's [12]
    if pat in ("all", "*"):
        return list(hosts)
    if pat.startswith("~"):
        try:
            rx = re.compile(pat[1:])
        except re.error as exc:
            raise InventoryError(f"--limit {pat[:80]!r}: not a regular expression ({exc})") from None
        match = lambda name: rx.match(name) is not None  # noqa: E731
    else:
        match = lambda name: fnmatch.fnmatchcase(name, pat)  # noqa: E731
    # ansible-core's _enumerate_matches: the groups it names, each group's hosts in the group's order; then the
    # hosts it names where no group matched, or where it is a regex or a glob
    if group_hosts is None:
        group_hosts = {}
        for h in hosts:
            for g in h.groups:
                group_hosts.setdefault(g, []).append(h.name)
    by_name = {h.name: h for h in hosts}
    names = [n for g, members in group_hosts.items() if match(g) for n in members]
    if not names or pat.startswith("~") or any(c in pat for c in ".?*["):
        names += [h.name for h in hosts if match(h.name)]
    return [by_name[n] for n in dict.fromkeys(names) if n in by_name]


def _glob(hosts: list[FleetHost], pat: str) -> list[FleetHost]:
    return [h for h in hosts if fnmatch.fnmatchcase(h.name, pat) or any(fnmatch.fnmatchcase(g, pat) for g in h.groups)]


def split_limit(limit: str) -> list[str]:
    """``--limit``'s patterns: separated by ``,`` (or ``:`` where no ``,`` is, as Ansible splits them), a
    subscript's or a range's ``:`` left whole."""
    if "," in limit:
        parts = limit.split(",")
    else:
        parts = re.split(r":(?![^\[]*\])", limit)
    return [p.strip() for p in parts if p.strip()]


def select(hosts: list[FleetHost], limit: str, group_hosts: dict[str, list[str]] | None = None) -> list[FleetHost]:
    """Ansible's --limit (ansible-core ``InventoryManager._evaluate_patterns``): the plain patterns united, then
    each ``&pat`` keeps only those it also names, then each ``!pat`` removes what it names; the hosts in
    inventory order. Each pattern as :func:`_one_pattern` reads it."""
    parts = split_limit(limit)
    plus = [p for p in parts if not p.startswith(("!", "&"))]
    chosen: list[FleetHost] = []
    if plus:
        named = {id(h) for p in plus for h in _one_pattern(hosts, p, group_hosts)}
        chosen = [h for h in hosts if id(h) in named]
    else:
        chosen = list(hosts)
    for p in parts:
        if p.startswith("&"):
            keep = {id(h) for h in _one_pattern(hosts, p[1:], group_hosts)}
            chosen = [h for h in chosen if id(h) in keep]
    for p in parts:
        if p.startswith("!"):
            drop = {id(h) for h in _one_pattern(hosts, p[1:], group_hosts)}
            chosen = [h for h in chosen if id(h) not in drop]
    return chosen


_RANGE = re.compile(r"\[([0-9]+|[a-zA-Z]):([0-9]+|[a-zA-Z])(?::([0-9]+))?\]")


#: the most hosts one inventory line's ranges may name: counted before anything is expanded, so a 28-byte line
#: like ``h[0:999][0:999][0:99]`` (10^8 names) is refused at once instead of filling memory (issue 21)
MAX_RANGE_HOSTS = 10_000


def _range_count(pattern: str) -> int:
    n = 1
    for m in _RANGE.finditer(pattern):
        beg, end, stride = m.group(1), m.group(2), max(1, int(m.group(3) or 1))
        if beg.isdigit() and end.isdigit():
            size = (int(end) - int(beg)) // stride + 1 if int(end) >= int(beg) else 0
        elif beg.isalpha() and end.isalpha():
            size = (ord(end) - ord(beg)) // stride + 1 if ord(end) >= ord(beg) else 0
        else:
            size = 1  # an error expand() reports with its own words
        n *= max(size, 1)
        if n > MAX_RANGE_HOSTS:
            break
    return n


def _ranges_named(text: str) -> int:
    """How many host names the ranges of a whole inventory expand to, at most (each word with a range, in any
    line: a host line, a YAML key), counted without expanding any; plain names count one each."""
    total = 0
    for word in re.findall(r"[^\s:'\"]*(?:\[[0-9a-zA-Z]+:[0-9a-zA-Z]+(?::[0-9]+)?\][^\s:'\"]*)+", text):
        total += _range_count(word) if _RANGE.search(word) else 0
        if total > MAX_INVENTORY_HOSTS:
            break
    return total


def expand(pattern: str) -> list[str]:
    """Ansible's host ranges: ``gpu-[01:04]`` (zero padded as written), ``[a:c]``, ``[1:9:2]``, several in one
    name. A range Ansible would refuse (mixed kinds, unequal padded widths) is an error, and so is one that names
    more than MAX_RANGE_HOSTS hosts."""
    count = _range_count(pattern)
    if count > MAX_RANGE_HOSTS:
        raise InventoryError(f"host range {pattern[:80]!r} names more than {MAX_RANGE_HOSTS:,} hosts: refused "
                             "before expanding it")
    return _expand(pattern)


def _expand(pattern: str) -> list[str]:
    m = _RANGE.search(pattern)
    if not m:
        return [pattern]
    beg, end, stride = m.group(1), m.group(2), int(m.group(3) or 1)
    head, tail = pattern[:m.start()], pattern[m.end():]
    if beg.isdigit() and end.isdigit():
        width = len(beg) if beg.startswith("0") and len(beg) > 1 else 0
        if width and len(end) != width:
            raise InventoryError(f"host range {m.group(0)}: padded ranges need ends of equal width")
        values = [str(i).zfill(width) for i in range(int(beg), int(end) + 1, max(1, stride))]
    elif beg.isalpha() and end.isalpha():
        values = [chr(c) for c in range(ord(beg), ord(end) + 1, max(1, stride))]
    else:
        raise InventoryError(f"host range {m.group(0)}: mixes letters and numbers")
    if not values:
        raise InventoryError(f"host range {m.group(0)}: empty")
    return [h for v in values for h in _expand(head + v + tail)]


def _ansible_exe() -> str | None:
    if os.environ.get("KVAUDIT_NO_ANSIBLE"):
        return None
    beside = Path(sys.executable).with_name("ansible-inventory")
    return str(beside) if beside.exists() else shutil.which("ansible-inventory")


def _inventory_limits() -> None:
    """In the ansible-inventory child: at most 2 GiB of address space and 60 s of CPU (an alias bomb or a huge
    host range ends there, not in the user's memory)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_CPU, (60, 60))


def ansible_inventory(path: str, timeout: float = 120.0) -> list[FleetHost] | None:
    """The inventory as Ansible resolves it (``ansible-inventory -i FILE --list``, only the ini and yaml
    plugins: no inventory script is ever run); None when Ansible is not installed."""
    exe = _ansible_exe()
    if exe is None:
        return None
    import tempfile

    # The working directory is not trusted (issue 21): its ansible.cfg could name vars or inventory plugins whose
    # code would run inside kvaudit. ansible-inventory gets an empty config of ours (ANSIBLE_CONFIG wins over
    # ./ansible.cfg), runs in an empty directory, and may use only the ini and yaml inventory plugins and the
    # host_group_vars vars plugin (group_vars/host_vars files: data, not code). Its time and memory are capped.
    with tempfile.TemporaryDirectory(prefix="kvaudit-ansible-") as tmp:
        cfg = Path(tmp) / "ansible.cfg"
        cfg.write_text("[defaults]\n", encoding="utf-8")
        env = {**os.environ, "ANSIBLE_CONFIG": str(cfg), "ANSIBLE_INVENTORY_ENABLED": "ini,yaml",
               "ANSIBLE_VARS_ENABLED": "host_group_vars", "ANSIBLE_VARS_PLUGINS": tmp,
               "ANSIBLE_INVENTORY_PLUGINS": tmp, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_INVENTORY_UNPARSED_FAILED": "1",
               "ANSIBLE_LOCAL_TEMP": tmp, "ANSIBLE_HOME": tmp}
        try:
            p = subprocess.run([exe, "-i", os.path.abspath(path), "--list"], capture_output=True,
                               timeout=max(1.0, min(120.0, timeout)),
                               env=env, stdin=subprocess.DEVNULL, cwd=tmp, preexec_fn=_inventory_limits)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InventoryError(f"ansible-inventory -i {path}: {exc}") from None
    if p.returncode != 0:
        why = p.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InventoryError(f"ansible-inventory -i {path}: {why[-1] if why else f'rc {p.returncode}'}")
    try:
        data = json.loads(p.stdout)
    except ValueError:
        raise InventoryError(f"ansible-inventory -i {path}: not JSON") from None
    return from_ansible_json(data)


def _ancestors(parents: dict[str, list[str]], g: str, seen: tuple[str, ...] = ()) -> list[str]:
    """Every group above ``g`` (outermost first), cycles cut."""
    out = []
    for parent in parents.get(g, []):
        if parent not in seen:
            out += _ancestors(parents, parent, seen + (parent,)) + [parent]
    return out


def from_ansible_json(data: dict) -> list[FleetHost]:
    """``ansible-inventory --list`` output -> hosts, in group order, each with every group it is in (with
    their ancestors) and its merged variables."""
    hostvars = (data.get("_meta") or {}).get("hostvars") or {}
    parents: dict[str, list[str]] = {}
    for g, node in data.items():
        for child in (node or {}).get("children", []) if isinstance(node, dict) else []:
            parents.setdefault(child, []).append(g)

    def lineage(g: str) -> list[str]:
        return _ancestors(parents, g)

    order: list[str] = []
    groups_of: dict[str, list[str]] = {}

    def walk(g: str, seen: tuple[str, ...] = ()) -> None:
        node = data.get(g) or {}
        for h in node.get("hosts", []):
            order.append(h)
            groups_of.setdefault(h, [])
            for x in lineage(g) + [g]:
                if x not in ("all", "ungrouped") and x not in groups_of[h]:
                    groups_of[h].append(x)
        for child in node.get("children", []):
            if child not in seen:
                walk(child, seen + (child,))

    walk("all")
    out = Hosts()
    for h in dict.fromkeys(order):
        v = {k: str(x) for k, x in (hostvars.get(h) or {}).items()}
        out.append(FleetHost(h, _target(h, v), tuple(groups_of.get(h, ())), v))
    nodes = {g: node for g, node in data.items() if isinstance(node, dict) and g != "_meta"}
    out.group_hosts = group_order({g: [str(h) for h in node.get("hosts", [])] for g, node in nodes.items()},
                                  {g: [str(c) for c in node.get("children", [])] for g, node in nodes.items()})
    return out


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
#: LeaderWorkerSet's worker index: "0" is the leader
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def from_kubernetes(target: str, selector: str | None, kubeconfig: str | None, timeout_s: float,
                    context: str | None = None, namespace: str | None = None,
                    node: str | None = None) -> list[FleetHost]:
    """``fleet k8s:NAMESPACE -l SELECTOR``: the servers among the pods the selector matches. The pods of one
    LeaderWorkerSet group are one server (audited together, ranks merged); every other pod is its own."""
    from kvaudit.collect.interface import CollectError
    from kvaudit.collect.kube import KubeReader, parse_target, with_namespace

    reader = KubeReader(kubeconfig, timeout_s, context=context)
    try:
        t = with_namespace(parse_target(target, selector, namespace), reader)
    except ValueError as exc:
        raise InventoryError(str(exc)) from None
    if t.pod:
        return [FleetHost(str(t), str(t))]
    from kvaudit.collect.kube import MAX_PODS

    try:
        pods = reader.pods(t.namespace, t.selector or "", node)
    except CollectError as exc:
        raise InventoryError(f"cannot list the pods of {t}: {exc}") from None
    if len(pods) > MAX_PODS:
        # the bound `check` applies to a selector holds in fleet too (issue 21): a selector matching 10,000 pods
        # is refused, not audited pod by pod
        raise InventoryError(f"-l {t.selector} selects {len(pods)} pods in {t.namespace} (at most {MAX_PODS} per "
                             "selector): narrow it, or list the servers in an inventory")
    hosts: dict[str, FleetHost] = {}
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        labels = pod.metadata.labels or {}
        if node and all(k in labels for k in GROUP_LABELS) and labels.get(WORKER_INDEX, "0") != "0":
            continue  # a node audits a multi-node group where its leader (worker 0) runs: once per group
        if all(k in labels for k in GROUP_LABELS):
            sel = ",".join(f"{k}={labels[k]}" for k in GROUP_LABELS)
            name = f"k8s:{t.namespace} -l {sel}"
            hosts.setdefault(name, FleetHost(name, f"k8s:{t.namespace}", (), {"kvaudit_selector": sel}))
        else:
            name = f"k8s:{t.namespace}/{pod.metadata.name}"
            hosts[name] = FleetHost(name, name)
    if not hosts and node:
        return []  # a node without a server of the selector: nothing to audit there, not an error
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
            for name in expand(tokens[0]):
                groups.setdefault(section, []).append((name, _kv(tokens[1:])))
    return _flatten(groups, group_vars, children)


def _flatten(groups, group_vars, children) -> list[FleetHost]:
    """One host per name, as Ansible merges it: the variables of ``all``, then of every group the host is in
    (directly or as a child's member) from the shallowest to the deepest, by name within a depth, then the
    host's own (later lines win)."""
    parents: dict[str, list[str]] = {}
    for parent, kids in children.items():
        for kid in kids:
            parents.setdefault(kid, []).append(parent)

    def ancestors(g: str) -> list[str]:
        return _ancestors(parents, g)

    def depth(g: str, seen: tuple[str, ...] = ()) -> int:
        ps = [p for p in parents.get(g, []) if p not in seen and p != "all"]
        return 1 + max((depth(p, seen + (p,)) for p in ps), default=0)

    order: list[str] = []
    member: dict[str, list[str]] = {}
    own: dict[str, dict[str, str]] = {}
    for g, members in groups.items():
        for name, hv in members:
            order.append(name)
            member.setdefault(name, [])
            for x in ancestors(g) + [g]:
                if x not in member[name] and x not in ("all", "ungrouped"):
                    member[name].append(x)
            own.setdefault(name, {}).update({k: str(x) for k, x in hv.items()})
    out = Hosts()
    for name in dict.fromkeys(order):
        v: dict[str, str] = {k: str(x) for k, x in group_vars.get("all", {}).items()}
        for grp in sorted(member[name], key=lambda x: (depth(x), x)):
            v.update({k: str(x) for k, x in group_vars.get(grp, {}).items()})
        v.update(own[name])
        out.append(FleetHost(name, _target(name, v), tuple(member[name]), v))
    out.group_hosts = group_order({g: [name for name, _ in members] for g, members in groups.items()},
                                  {g: list(kids) for g, kids in children.items()})
    return out


#: the most values a YAML inventory may expand to (its aliases followed)
MAX_YAML_NODES = 200_000


def _expanded_size(doc: object) -> int:
    """How many values the document holds with every alias expanded, computed once per shared object (PyYAML
    builds an alias as a reference to the same object), without recursion; at most just over the limit."""
    size: dict[int, int] = {}
    open_: set[int] = set()  # containers whose children are being counted: meeting one again is a cycle
    stack: list[tuple[object, bool]] = [(doc, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        kids = (list(node.keys()) + list(node.values()) if isinstance(node, dict)
                else list(node) if isinstance(node, list) else [])
        if not done and kids:
            if id(node) in open_:
                return MAX_YAML_NODES + 1  # a recursive alias (an object inside itself) has no finite size
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        open_.discard(id(node))
        size[id(node)] = min(1 + sum(size.get(id(k), 1) for k in kids), MAX_YAML_NODES + 1)
    return size.get(id(doc), 1)


def _yaml(text: str, path: str) -> list[FleetHost]:
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - a dependency
        raise InventoryError("reading a YAML inventory needs PyYAML") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"{path}: not valid YAML ({exc})") from None
    except RecursionError:
        raise InventoryError(f"{path}: YAML nested too deeply") from None
    if _expanded_size(doc) > MAX_YAML_NODES:
        # aliases make a small file a huge document ("billion laughs": 393 bytes, 387 million strings): counted
        # over the shared structure in linear time, refused before anything walks or prints it (issue 21)
        raise InventoryError(f"{path}: the YAML expands to more than {MAX_YAML_NODES:,} values through its aliases: "
                             "refused")
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
            for one in expand(str(h)):
                groups.setdefault(name, []).append((one, {k: str(x) for k, x in (hv or {}).items()}))
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
