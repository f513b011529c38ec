"""SSH transport (paramiko): ssh_config, ProxyJump/ProxyCommand, host keys, timeouts, one deadline per host.

paramiko parses ssh_config but applies none of it, implements no ProxyJump, ignores wildcard known_hosts
entries and aborts on ``@cert-authority`` lines; this module does those parts the way OpenSSH does
(see ../shared notes in docs/check.md). Host keys: unknown keys are refused unless the user opts in with
``accept_new`` (OpenSSH's ``StrictHostKeyChecking=accept-new``), which records the key in the first
UserKnownHostsFile; a changed key is always refused.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import logging
import math
import os
import re
import secrets
import select
import shlex
import socket
import threading
import time
import weakref
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from kvaudit.collect.interface import (
    AuthFailed,
    CollectError,
    CommandResult,
    ConnectionDropped,
    HostKeyRefused,
    HostTimeout,
    Unreachable,
)
from kvaudit.collect.commands import shown
from kvaudit.collect.watchdog import Watchdog
from kvaudit.textsafe import printable
from kvaudit.record import record

DEFAULT_CONNECT_TIMEOUT = 10.0
_append_lock = threading.Lock()

# paramiko's transport thread logs failures (with tracebacks) at ERROR; with no logging configured Python's
# last-resort handler would print them on stderr. kvaudit reports each failure itself, in one line.
_plog = logging.getLogger("paramiko")
_plog.addHandler(logging.NullHandler())
_plog.propagate = False
_paramiko_lock = threading.Lock()


def _paramiko(match_exec: bool = False):
    """paramiko, imported without ``invoke``: paramiko.config imports it (with unittest.mock, asyncio and a vendored
    yaml: ~50 ms of every SSH check's start) for ssh_config's ``Match exec`` alone, and tolerates its absence until
    a ``Match exec`` is evaluated (``invoke_import_error`` is raised there). ``match_exec``: paramiko is about to
    evaluate ssh_config itself (no OpenSSH client): invoke is loaded back first, so ``Match exec`` runs as before."""
    import sys

    with _paramiko_lock:
        if "paramiko" not in sys.modules and "invoke" not in sys.modules:
            sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` raises ImportError
            try:
                import paramiko  # type: ignore[import-untyped]  # noqa: F401
            finally:
                if sys.modules.get("invoke", 0) is None:
                    del sys.modules["invoke"]
    import paramiko
    import paramiko.config  # type: ignore[import-untyped]

    if match_exec and paramiko.config.invoke is None:
        try:
            import invoke
        except ImportError as exc:
            paramiko.config.invoke_import_error = exc
        else:
            paramiko.config.invoke = invoke
    return paramiko


#: the AEAD ciphers, offered first: paramiko's default order puts aes*-ctr with hmac-sha2 first, whose MAC it
#: checks byte by byte in Python (util.constant_time_bytes_eq) on every packet, ~2 ms of a check's transport thread
#: (issue 40); GCM's tag is checked inside the cryptography library. The rest of the list follows in paramiko's
#: order, so a server without GCM negotiates as before. OpenSSH's sshd offers both since 6.2.
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
_transport_class = None


def _transport_factory(paramiko):
    """paramiko's Transport with AEAD_CIPHERS offered first (those this paramiko implements)."""
    global _transport_class
    if _transport_class is None:
        base = paramiko.Transport._preferred_ciphers
        first = tuple(c for c in AEAD_CIPHERS if c in base)
        _transport_class = type("AeadFirstTransport", (paramiko.Transport,),
                                {"_preferred_ciphers": first + tuple(c for c in base if c not in first)})
    return _transport_class


@record
class Target:
    user: str | None
    host: str
    port: int | None

    @staticmethod
    def parse(text: str) -> "Target":
        user, _, rest = text.rpartition("@")
        host, port = rest, None
        if rest.startswith("["):  # [v6addr]:port
            close = rest.find("]")
            host, tail = rest[1:close], rest[close + 1 :]
            if tail.startswith(":") and tail[1:].isdigit():
                port = int(tail[1:])
        elif rest.count(":") == 1:
            h, p = rest.split(":")
            if p.isdigit():
                host, port = h, int(p)
        if not host:
            raise ValueError(f"not a host: {text!r}")
        return Target(user or None, host, port)


@record
class HostConfig:
    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts: tuple[str, ...]
    connect_timeout: float
    proxy_jump: str | None
    proxy_command: str | None
    #: ssh_config's StrictHostKeyChecking as OpenSSH normalises it (``ssh -G``: true, false, ask, accept-new)
    strict_host_key_checking: str = "ask"
    #: ssh_config's HashKnownHosts: a key trusted on first use is recorded hashed (``|1|salt|hmac``), as OpenSSH does
    hash_known_hosts: bool = False

    @property
    def accepts_new_keys(self) -> bool:
        """``accept-new`` (and ``no``, which kvaudit reads as accept-new: a *changed* key is refused whatever
        ssh_config says; OpenSSH would connect with a warning, and nobody reads a warning in a nightly run)."""
        return self.strict_host_key_checking in ("accept-new", "false", "no", "off")


class SshConfigError(CollectError):
    reason = "ssh_config"  # the ssh_config cannot be applied to this host: a usage problem (exit 2)


#: what OpenSSH (9.6+, ``valid_hostname``/``valid_ruser``) refuses in a host or user name from the command line:
#: shell syntax, which a ProxyCommand's ``%h``/``%r`` would hand to a shell (an inventory's ``ansible_host``)
_SHELL_SYNTAX = set("'`\"$\\;&<>|(){}*?!~#")


def check_names(t: "Target") -> None:
    """Refuse a target whose host or user name holds shell syntax, whitespace or control characters, or starts with
    ``-``, before any ssh_config is applied (with or without ``ssh -G``: KVAUDIT_NO_SSH_G=1 expanded ``%h`` in a
    ProxyCommand all the same)."""
    for what, name in (("host", t.host), ("user", t.user)):
        if name is not None and (name.startswith("-") or any(c in _SHELL_SYNTAX or c.isspace() or not c.isprintable()
                                                             for c in name)):
            raise SshConfigError(f"{printable(name)[:80]!r}: a {what} name holds shell syntax, a space or a control "
                                 "character (refused before any ProxyCommand could run it, as OpenSSH refuses it)")


def _ssh_g(t: "Target", ssh_config: str | None) -> dict[str, list[str]] | None:
    """What OpenSSH itself would use for this host (``ssh -G``: Include, Match, tokens, canonicalisation,
    defaults), as ``{option: [values]}``; None when the ssh client is not installed."""
    import shutil
    import subprocess

    ssh = None if os.environ.get("KVAUDIT_NO_SSH_G") else shutil.which("ssh")
    if ssh is None:
        return None
    argv = [ssh, "-G"] + (["-F", str(Path(ssh_config).expanduser())] if ssh_config else [])
    argv += (["-l", t.user] if t.user else []) + (["-p", str(t.port)] if t.port else []) + ["--", t.host]
    try:
        p = subprocess.run(argv, capture_output=True, timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SshConfigError(f"{t.host}: ssh -G did not answer ({exc})") from None
    if p.returncode != 0:
        why = printable(p.stderr.decode("utf-8", "replace").strip().splitlines()[0] if p.stderr.strip() else
                        f"rc {p.returncode}")
        raise SshConfigError(f"{t.host}: OpenSSH cannot apply the ssh_config"
                             f"{' ' + str(ssh_config) if ssh_config else ''}: {why}")
    out: dict[str, list[str]] = {}
    for line in p.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        if key:
            out.setdefault(key.lower(), []).append(value.strip())
    return out


def _from_ssh_g(t: "Target", g: dict[str, list[str]]) -> HostConfig:
    def one(key: str, default: str | None = None) -> str | None:
        v = g.get(key)
        return v[0] if v else default

    hostname = one("hostname", t.host) or t.host
    port = int(one("port", "22") or 22)
    user = one("user") or t.user or getpass.getuser()
    timeout = one("connecttimeout", "none")
    pc = one("proxycommand")
    if pc and pc.lower() != "none":  # ssh expands these at connect time; so do we
        pc = pc.replace("%%", "\0").replace("%h", hostname).replace("%p", str(port)).replace("%r", user) \
            .replace("%n", t.host).replace("\0", "%")
    pj = one("proxyjump")
    known = tuple(os.path.expanduser(p) for v in g.get("userknownhostsfile", []) for p in v.split()) or (
        os.path.expanduser("~/.ssh/known_hosts"),)
    return HostConfig(
        alias=t.host, hostname=hostname, port=port, user=user,
        identity_files=tuple(os.path.expanduser(p) for p in g.get("identityfile", [])),
        identities_only=(one("identitiesonly", "no") or "no").lower() == "yes",
        known_hosts=known,
        connect_timeout=float(timeout) if timeout and timeout.lower() != "none" else DEFAULT_CONNECT_TIMEOUT,
        proxy_jump=None if not pj or pj.lower() == "none" else pj,
        proxy_command=pc if pc and pc.lower() != "none" else None,
        strict_host_key_checking=(one("stricthostkeychecking", "ask") or "ask").lower(),
        hash_known_hosts=(one("hashknownhosts", "no") or "no").lower() == "yes",
    )


def resolve(target: str, ssh_config: str | None) -> HostConfig:
    """Apply ssh_config (``--ssh-config`` or ~/.ssh/config) to a ``user@host[:port]`` or an alias: with
    OpenSSH's own ``ssh -G`` when the client is installed (exactly what ``ssh`` would do), else paramiko's
    reader (no Match, no Include of globs, no canonicalisation)."""
    t = Target.parse(target)
    check_names(t)
    if ssh_config and not Path(ssh_config).expanduser().exists():
        raise SshConfigError(f"ssh config {ssh_config} does not exist")
    g = _ssh_g(t, ssh_config)
    if g is not None:
        return _from_ssh_g(t, g)
    path = Path(ssh_config).expanduser() if ssh_config else Path("~/.ssh/config").expanduser()
    paramiko = _paramiko(match_exec=True)
    cfg = paramiko.SSHConfig()
    if path.exists():
        try:
            cfg = paramiko.SSHConfig.from_path(str(path))
        except Exception as exc:  # paramiko raises several types for malformed files
            raise CollectError(f"cannot read ssh config {path}: {exc}") from None
    elif ssh_config:
        raise CollectError(f"ssh config {path} does not exist")
    hc = cfg.lookup(t.host)
    port = t.port or int(hc.get("port", 22))
    known = tuple(os.path.expanduser(p) for p in (hc.get("userknownhostsfile") or "").split()) or (
        os.path.expanduser("~/.ssh/known_hosts"),)
    pj = hc.get("proxyjump")
    return HostConfig(
        alias=t.host,
        hostname=hc.get("hostname", t.host),
        port=port,
        user=t.user or hc.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in hc.get("identityfile", [])),
        identities_only=str(hc.get("identitiesonly", "no")).lower() == "yes",
        known_hosts=known,
        connect_timeout=float(hc.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT)),
        proxy_jump=None if not pj or pj.lower() == "none" else pj,
        proxy_command=hc.get("proxycommand") if str(hc.get("proxycommand", "none")).lower() != "none" else None,
        strict_host_key_checking={"yes": "true", "no": "false"}.get(
            str(hc.get("stricthostkeychecking", "ask")).lower(), str(hc.get("stricthostkeychecking", "ask")).lower()),
        hash_known_hosts=str(hc.get("hashknownhosts", "no")).lower() == "yes",
    )


# ----------------------------------------------------------------------------------------------------------
# host keys


def fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _host_matches(patterns: str, name: str) -> bool:
    """OpenSSH known_hosts host field: comma-separated patterns, ``*``/``?`` wildcards, ``!`` negation,
    or one hashed ``|1|salt|hash`` entry."""
    if patterns.startswith("|1|"):
        try:
            _, _, salt, digest = patterns.split("|")
            mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(base64.b64encode(mac).decode(), digest)
        except (ValueError, TypeError):
            return False
    hit = False
    for pat in patterns.split(","):
        neg = pat.startswith("!")
        if _pattern(pat.lstrip("!")).fullmatch(name):
            if neg:
                return False
            hit = True
    return hit


@lru_cache(maxsize=1024)  # each known_hosts line's patterns, once per process rather than once per host
def _pattern(pat: str) -> "re.Pattern[str]":
    """OpenSSH patterns know only ``*`` and ``?``; ``[host]:port`` brackets are literal (not fnmatch classes)."""
    return re.compile("".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pat))


@record
class KnownKey:
    keytype: str
    blob: str
    revoked: bool
    source: str


def known_keys(files: tuple[str, ...], name: str) -> list[KnownKey]:
    """Entries for ``name`` (``host`` or ``[host]:port``), line by line: a line paramiko cannot load
    (``@cert-authority``, garbage) is skipped, not fatal."""
    out = []
    for f in list(files) + ["/etc/ssh/ssh_known_hosts"]:
        try:
            text = Path(f).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            revoked = False
            if parts[0].startswith("@"):
                if parts[0] != "@revoked":
                    continue  # @cert-authority: CA-signed host certificates are not supported here
                revoked, parts = True, parts[1:]
            if len(parts) < 3:
                continue
            if _host_matches(parts[0], name):
                out.append(KnownKey(parts[1], parts[2], revoked, f"{f}:{n}"))
    return out


def hashed_name(name: str) -> str:
    """A known_hosts host field as OpenSSH's HashKnownHosts writes it: ``|1|`` base64(salt) ``|`` base64(HMAC-SHA1
    of the name keyed by the salt)."""
    salt = secrets.token_bytes(20)
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


class HostKeyPolicy:
    """Decides on every host key (paramiko is given no keys of its own, so all of them come here)."""

    def __init__(self, files: tuple[str, ...], accept_new: bool, hashed: bool = False):
        self.files = files
        self.accept_new = accept_new
        self.hashed = hashed
        self.accepted_new: str | None = None

    def missing_host_key(self, client, hostname: str, key) -> None:
        entries = known_keys(self.files, hostname)
        blob = key.get_base64()
        if any(e.revoked and e.blob == blob for e in entries):
            raise HostKeyRefused(f"host key of {hostname} ({fingerprint(key)}) is marked @revoked")
        pinned = [e for e in entries if not e.revoked]
        same_type = [e for e in pinned if e.keytype == key.get_name()]
        if any(e.blob == blob for e in same_type):
            return
        if pinned:  # known by a key of this type or of another: as OpenSSH, a different key is a changed key
            raise HostKeyRefused(
                f"HOST KEY CHANGED for {hostname}: it offers {key.get_name()} {fingerprint(key)}, but "
                f"{pinned[0].source} pins {pinned[0].keytype} {'a different key' if same_type else 'keys'}. "
                "Refusing, even with --accept-new-host-key (a reinstalled host, or someone in the middle); "
                "remove the old line only if you know why it changed")
        if not self.accept_new:
            raise HostKeyRefused(
                f"host key of {hostname} is not known ({key.get_name()} {fingerprint(key)}); verify it and add "
                f"it to {self.files[0]}, or rerun with --accept-new-host-key (or StrictHostKeyChecking accept-new "
                "in ssh_config) to trust it on first use")
        path = Path(self.files[0])
        with _append_lock:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(f"{hashed_name(hostname) if self.hashed else hostname} {key.get_name()} {blob}\n")
        self.accepted_new = f"{hostname} {key.get_name()} {fingerprint(key)} -> {path}"


# ----------------------------------------------------------------------------------------------------------
# connections


#: host-key algorithms a known_hosts key type can be verified with
_ALGORITHMS_OF = {"ssh-rsa": {"rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"}}


def _unpinned_host_key_algorithms(pinned: set[str], offered: tuple[str, ...]) -> dict[str, list[str]]:
    """For a known host, the host-key algorithms of the types it is not pinned by: disabled, so the pinned
    types are negotiated (a host pinned only by RSA or ECDSA is verified by that key, as OpenSSH orders
    HostKeyAlgorithms for a known host) rather than a newer type that would look unknown."""
    if not pinned:
        return {}
    allowed = set().union(*(_ALGORITHMS_OF.get(t, {t}) for t in pinned))
    if not allowed & set(offered):
        return {}  # nothing we could verify it with: the policy refuses whatever the host offers
    return {"keys": [a for a in offered if a not in allowed]}


def _server_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


#: every open runner, so that Ctrl-C can close them all (a worker blocked in a read returns at once)
_OPEN: "weakref.WeakSet[SSHRunner]" = weakref.WeakSet()


def close_all() -> None:
    for r in list(_OPEN):
        r.cancelled = True  # no reconnect after this
        r.close()


class SSHRunner:
    """One host: a connected SSHClient (plus its jump hosts) and the host's deadline."""

    def __init__(self, target: str, ssh_config: str | None = None, accept_new: bool = False,
                 deadline_s: float = 120.0, connect_timeout: float | None = None, identity_file: str | None = None):
        self.target = target
        self.deadline = time.monotonic() + deadline_s
        self.deadline_s = deadline_s
        self._clients: list = []
        _OPEN.add(self)
        self.policy_note: str | None = None
        hc = resolve(target, ssh_config)
        if identity_file:  # tried first, as ssh -i does
            hc = replace(hc, identity_files=(os.path.expanduser(identity_file),) + hc.identity_files)
        self.config = hc
        self._how = (accept_new, connect_timeout, ssh_config)
        self.reconnected = False  # the connection closed between two commands and was opened again, once
        self.cancelled = False  # closed on the user's request (Ctrl-C): never reopened
        self.client = self._connect(hc, accept_new, connect_timeout, depth=0, ssh_config=ssh_config)

    def _transport(self):
        """The live transport. One that closed between two commands (the server's side, a rekey that failed
        under load) is replaced once by a new connection, within the host deadline; a second is a drop."""
        transport = self.client.get_transport()
        if transport is not None and transport.is_active():
            return transport
        if self.cancelled:
            raise ConnectionDropped(f"{self.target}: connection closed (interrupted)")
        if self.reconnected:
            raise ConnectionDropped(f"{self.target}: connection closed (again, after one reconnect)")
        self.reconnected = True
        self.close()
        accept_new, connect_timeout, ssh_config = self._how
        self.client = self._connect(self.config, accept_new, connect_timeout, depth=0, ssh_config=ssh_config)
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionDropped(f"{self.target}: connection closed")
        return transport

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.close()
            raise HostTimeout(f"{self.target}: no answer within the {self.deadline_s:g} s host deadline")
        return left

    def _connect(self, hc: HostConfig, accept_new: bool, connect_timeout: float | None, depth: int,
                 ssh_config: str | None, sock=None):
        paramiko = _paramiko()

        if depth > 5:
            raise CollectError(f"{hc.alias}: more than 5 ProxyJump hops")
        timeout = min(connect_timeout or hc.connect_timeout, self._remaining())
        if sock is None and hc.proxy_jump:
            hops = [h.strip() for h in hc.proxy_jump.split(",") if h.strip()]
            via = None
            for i, hop in enumerate(hops):
                hop_cfg = resolve(hop, ssh_config)
                hop_client = self._connect(hop_cfg, accept_new, connect_timeout, depth + 1, ssh_config, sock=via)
                nxt = resolve(hops[i + 1], ssh_config) if i + 1 < len(hops) else hc
                try:
                    via = hop_client.get_transport().open_channel(
                        "direct-tcpip", (nxt.hostname, nxt.port), ("", 0), timeout=timeout)
                except Exception as exc:
                    raise Unreachable(f"{hc.alias}: jump host {hop} could not reach {nxt.hostname}:{nxt.port}: "
                                      f"{exc}") from None
            sock = via
        elif sock is None and hc.proxy_command:
            sock = paramiko.ProxyCommand(hc.proxy_command)
        client = paramiko.SSHClient()
        policy = HostKeyPolicy(hc.known_hosts, accept_new or hc.accepts_new_keys, hc.hash_known_hosts)
        client.set_missing_host_key_policy(policy)
        name = f"{hc.user}@{hc.hostname}:{hc.port}"
        pinned = {e.keytype for e in known_keys(hc.known_hosts, _server_name(hc.hostname, hc.port)) if not e.revoked}
        # as OpenSSH: an IdentityFile that does not exist is skipped (and named if authentication then fails)
        keys = [p for p in hc.identity_files if os.path.exists(p)]
        missing = [p for p in hc.identity_files if p not in keys]
        no_key = f" (IdentityFile {', '.join(missing)}: no such file)" if missing else ""
        try:
            client.connect(
                hc.hostname, port=hc.port, username=hc.user,
                disabled_algorithms=_unpinned_host_key_algorithms(pinned, paramiko.Transport._preferred_keys),
                key_filename=keys or None,
                look_for_keys=not hc.identities_only,
                allow_agent=not (hc.identities_only and hc.identity_files),
                timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                sock=sock, transport_factory=_transport_factory(paramiko),
            )
        except HostKeyRefused:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRefused(f"HOST KEY CHANGED for {name}: {exc}") from None
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthFailed(f"{name}: the private key needs a passphrase; load it into ssh-agent") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthFailed(f"{name}: authentication refused ({exc}){no_key}") from None
        except (socket.timeout, TimeoutError):
            client.close()
            raise Unreachable(f"{name}: connection timed out after {timeout:g} s") from None
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            raise Unreachable(f"{name}: connection refused ({exc.strerror or exc})") from None
        except socket.gaierror as exc:
            client.close()
            raise Unreachable(f"{name}: cannot resolve host ({exc.strerror})") from None
        except paramiko.SSHException as exc:
            client.close()
            msg = str(exc)
            # paramiko reports a server that never speaks as a banner error, or as "No existing session"
            # when its transport thread gave up before authentication
            if any(w in msg.lower() for w in ("banner", "timed out", "timeout", "no existing session")):
                raise Unreachable(f"{name}: no SSH answer within {timeout:g} s ({msg})") from None
            if "no authentication methods" in msg.lower():  # no key, no agent, nothing to offer: an auth problem
                raise AuthFailed(f"{name}: no authentication method to offer (no usable IdentityFile, no "
                                 f"ssh-agent key){no_key}: {msg}") from None
            if pinned and "no acceptable host key" in msg.lower():
                raise HostKeyRefused(
                    f"HOST KEY CHANGED for {name}: known_hosts pins it by {', '.join(sorted(pinned))}, and it "
                    "offers no key of that type. Refusing, even with --accept-new-host-key (a reinstalled host, "
                    "or someone in the middle)") from None
            raise Unreachable(f"{name}: SSH failed: {msg}") from None
        except OSError as exc:
            client.close()
            raise Unreachable(f"{name}: {exc.strerror or exc}") from None
        if policy.accepted_new:
            self.policy_note = f"new host key accepted and recorded: {policy.accepted_new}"
        try:  # small request/response packets: without this, Nagle + delayed ACK add ~40 ms to each
            client.get_transport().sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, AttributeError):
            pass  # a ProxyCommand or jump channel is not a TCP socket
        self._clients.append(client)
        return client

    def run_batch(self, commands: list[str], timeout: float, max_bytes: int) -> list[CommandResult]:
        """Several small commands in one SSH session (one round trip, one remote shell), told apart by
        marker lines carrying a random nonce; each command's stderr is merged into its output."""
        return run_batch(self, commands, timeout, max_bytes)

    def run(self, command: str, timeout: float, max_bytes: int) -> CommandResult:
        """Run one command; drain stdout and stderr as they come (never wait for the exit status first,
        which can deadlock on a full window); stop at the command timeout, the host deadline, or
        ``max_bytes`` of output."""
        paramiko = _paramiko()

        start = time.monotonic()
        limit = min(timeout, self._remaining())
        transport = self._transport()
        # paramiko waits for the answer to the exec request without a timeout (Channel._wait_for_event): a server
        # that opens the session and never answers would hold the host past its deadline. A watchdog closes the
        # transport at the deadline, which ends that wait (the channel is closed under it)
        with Watchdog(max(0.05, self._remaining()), transport.close) as dog:
            try:
                chan = transport.open_session(timeout=min(10.0, limit))
                chan.exec_command(bounded(command, limit))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if dog.fired:
                    self.close()
                    raise HostTimeout(f"{self.target}: no answer within the {self.deadline_s:g} s host deadline "
                                      f"(the server did not answer the request to run: {shown(command)})") from None
                raise ConnectionDropped(f"{self.target}: could not start a command ({_said(exc)})") from None
        out, err = bytearray(), bytearray()
        truncated = False
        while True:
            now = time.monotonic()
            if now - start > limit:
                chan.close()
                if time.monotonic() >= self.deadline:
                    self.close()
                    raise HostTimeout(f"{self.target}: no answer within the {self.deadline_s:g} s host deadline "
                                      f"(while running: {shown(command)})")
                return CommandResult(command, None, bytes(out), bytes(err) + b"\n[kvaudit: timed out]",
                                     now - start, truncated)
            got = False
            while chan.recv_ready():
                out += chan.recv(1 << 16)
                got = True
            while chan.recv_stderr_ready():
                chunk = chan.recv_stderr(1 << 16)  # drained, but only the head is kept (the first lines are used)
                if len(err) < STDERR_KEEP:
                    err += chunk[:STDERR_KEEP - len(err)]
                got = True
            if len(out) > max_bytes:
                truncated = True
                del out[max_bytes:]
                chan.close()
                return CommandResult(command, None, bytes(out), bytes(err), time.monotonic() - start, True)
            # done when the exit status is in AND the output is complete (EOF): sshd may send the exit status
            # before the last of the output when the command exits first, so the status alone is not the end
            output_done = chan.eof_received or chan.closed
            if chan.exit_status_ready() and output_done and not chan.recv_ready() and not chan.recv_stderr_ready():
                rc = chan.recv_exit_status()
                chan.close()
                if rc == -1:  # the channel closed without an exit status: killed, or the connection went
                    settle = time.monotonic() + 1.0
                    while transport.is_active() and time.monotonic() < settle:
                        time.sleep(0.05)
                    if not transport.is_active():
                        raise ConnectionDropped(
                            f"{self.target}: the connection dropped in the middle of a command's output "
                            f"({len(out):,} bytes received of: {shown(command)})")
                    return CommandResult(command, None, bytes(out), bytes(err), time.monotonic() - start, truncated)
                return CommandResult(command, rc, bytes(out), bytes(err), time.monotonic() - start, truncated)
            if got:
                continue
            if not transport.is_active():
                raise ConnectionDropped(f"{self.target}: the connection dropped in the middle of a command's output "
                                        f"({len(out):,} bytes received of: {shown(command)})")
            if chan.eof_received:
                chan.status_event.wait(0.1)  # output is complete; the exit status is on its way
            else:
                select.select([chan], [], [], 0.2)

    def close(self) -> None:
        for c in reversed(self._clients):
            try:
                c.close()
            except Exception:
                pass
        self._clients.clear()


#: the most output one batch of small commands may return
BATCH_MAX_BYTES = 16 << 20
#: how much of a command's stderr is kept: its first lines say what went wrong; a host that floods stderr
#: must not grow kvaudit's memory
STDERR_KEEP = 16 << 10
#: the remote wrapper: the command runs under coreutils/BusyBox ``timeout`` (its own process group, killed
#: whole, SIGKILL 2 s after SIGTERM) so nothing of kvaudit's outlives its limit on the host, even when the
#: SSH session is gone; on a host without ``timeout`` it runs as is. The limit and the command are positional
#: parameters, never code.
BOUNDED_SCRIPT = ('if command -v timeout >/dev/null 2>&1; then exec timeout -k 2 "$1" sh -c "$2"; '
                  'else exec sh -c "$2"; fi')


def bounded(command: str, limit: float) -> str:
    """The command as sent to the host: wrapped so that it dies on its own after ``limit`` seconds (plus 1)."""
    return shlex.join(["sh", "-c", BOUNDED_SCRIPT, "sh", str(max(1, math.ceil(limit)) + 1), command])


def _said(exc: BaseException) -> str:
    """An SSH library error in kvaudit's words (paramiko's own text is kept after them, in quotes)."""
    paramiko = _paramiko()

    if isinstance(exc, paramiko.ChannelException):
        return (f"the server refused to open a session channel: '{getattr(exc, 'text', '') or exc}' (its MaxSessions, "
                "or an account restricted to no sessions)")
    text = str(exc) or type(exc).__name__
    if "no existing session" in text.lower():
        return "the SSH connection ended before a session could be opened"
    if isinstance(exc, EOFError):
        return "the server closed the connection"
    return text


def run_batch(runner, commands: list[str], timeout: float, max_bytes: int) -> list[CommandResult]:
    if len(commands) == 1:
        return [runner.run(commands[0], timeout, max_bytes)]
    nonce = secrets.token_hex(8)
    script = "; ".join(
        f"printf '\\n@@{nonce} {i} begin\\n'; {{ {c} ; }} 2>&1; printf '\\n@@{nonce} {i} end %s\\n' \"$?\""
        for i, c in enumerate(commands))
    # a batch carries small outputs (names, readings, a config.json of at most 4 MiB), stderr merged in: a
    # host that floods one of them is cut here, not at n x the log's limit
    res = runner.run(script, timeout * len(commands), min(max_bytes * len(commands), BATCH_MAX_BYTES))
    marker = re.compile(rb"\n@@" + nonce.encode() + rb" (\d+) (begin|end)(?: (\d+))?\n")
    outs: dict[int, bytes] = {}
    rcs: dict[int, int] = {}
    start = None
    for m in marker.finditer(res.stdout):
        i = int(m.group(1))
        if m.group(2) == b"begin":
            start = m.end()
        elif start is not None:
            outs[i] = res.stdout[start:m.start()]
            rcs[i] = int(m.group(3))
            start = None
    each = res.seconds / len(commands)
    results = []
    for i, c in enumerate(commands):
        if i in outs:
            results.append(CommandResult(c, rcs[i], outs[i], b"" if rcs[i] == 0 else outs[i], each, res.truncated))
        else:  # the batch stopped before this command finished (timeout, size limit)
            results.append(CommandResult(c, None, b"", res.stderr or b"[kvaudit: batch did not reach this command]",
                                         each, res.truncated, unreached=True))
    return results
