"""Servers in Kubernetes pods: the container's output is the startup log, read through the API server with the
official ``kubernetes`` client (an optional extra: ``pip install 'kvaudit[k8s]'``).

Targets: ``k8s:NAMESPACE/POD[/CONTAINER]``, or ``k8s:NAMESPACE`` with a label selector for a multi-node group
(a LeaderWorkerSet's ``leaderworkerset.sigs.k8s.io/name=NAME``): every pod of the group is read and their lines
merged in time order, the ranks told apart by their own tags. Read-only: ``get pods`` and ``get pods/log``
(``GET /api/v1/namespaces/{ns}/pods/{pod}[/log]``, ``GET /api/v1/namespaces/{ns}/pods?labelSelector=``), with
``timestamps=true`` (the RFC 3339 prefix orders the merge; the grammars read past it) and ``limitBytes`` (the
head of the log, where the startup is). A container that restarted and whose latest instance holds no startup
is read again with ``previous=true``, and the report says so. The kubelet rotates container logs (10 MiB x 5 by
default; the API returns only the newest file): when the startup is gone, the error says so and names the
server's own endpoint to audit instead. GPU readings need ``pods/exec``, which kvaudit does not use: the audit
says they were not available.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
import socket
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable

from kvaudit.collect.interface import (AuthFailed, CollectError, Collected, CommandRecord, HostTimeout,
                                       NoEngineFound, Unreachable)
from kvaudit.collect.watchdog import Watchdog
from kvaudit.targets import is_pod_target  # noqa: F401  (defined where telling it loads nothing: kvaudit.targets)
from kvaudit.textsafe import printable
from kvaudit.record import record

#: the head of each container's log that is read (the startup is at the head; the API bounds it server-side)
LOG_LIMIT_BYTES = 64 << 20
#: the most pods one selector may name (a typo like ``-l app`` must not pull a whole namespace's logs)
MAX_PODS = 64
NO_GPU_READINGS = "no GPU readings: nvidia-smi gave none inside the container (pods/exec)"
#: ``k8s:NAMESPACE/POD[/CONTAINER]``, ``k8s:NAMESPACE`` (with -l), and as kubectl without -n: ``k8s:/POD`` or
#: ``k8s:`` (with -l), the namespace then -n's, else the kubeconfig context's, else "default"
_TARGET = re.compile(r"k8s:(?P<ns>[a-z0-9]([-a-z0-9]*[a-z0-9])?)?(?:/(?P<pod>[a-z0-9][-a-z0-9.]*))?"
                     r"(?:/(?P<container>[a-z0-9][-a-z0-9]*))?$")
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ")


class KubeError(CollectError):
    reason = "kubernetes"  # the kubeconfig or the client: a usage problem (exit 2)


class NotFound(CollectError):
    reason = "not_found"  # namespace, pod or container does not exist (exit 2)


class Forbidden(CollectError):
    reason = "forbidden"  # RBAC: the verb and resource that are missing are named (exit 5)


class BadAnswer(CollectError):
    reason = "bad_answer"  # the API server answered with something no API server serves (exit 4)


#: a pod or container name as Kubernetes admits it (an RFC 1123 label or subdomain): anything else in an answer
#: is not a pod the API server could hold, and never reaches a report
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


@record
class PodTarget:
    namespace: str
    pod: str | None
    container: str | None
    selector: str | None = None

    def __str__(self) -> str:
        if self.pod:
            return f"k8s:{self.namespace}/{self.pod}" + (f"/{self.container}" if self.container else "")
        return f"k8s:{self.namespace} -l {self.selector}"


def parse_target(target: str, selector: str | None = None, namespace: str | None = None) -> PodTarget:
    """The pod target; an empty namespace (``k8s:/POD``) is ``namespace`` (-n) when given, else left empty for
    :func:`with_namespace` to fill from the kubeconfig context, as kubectl does."""
    m = _TARGET.match(target)
    if not m or (m.group("ns") is None and m.group("container") and not m.group("pod")):
        raise ValueError(f"{target}: use k8s:NAMESPACE/POD[/CONTAINER], or k8s:NAMESPACE -l SELECTOR "
                         "(names are lower-case DNS labels; k8s:/POD takes -n or the context's namespace)")
    if namespace is not None and not _NAME.fullmatch(namespace):
        raise ValueError(f"-n {namespace!r}: a namespace is a lower-case DNS label")
    ns = m.group("ns")
    if ns and namespace and ns != namespace:
        raise ValueError(f"{target}: the target names namespace {ns}, -n says {namespace}")
    if m.group("pod") and selector:
        raise ValueError(f"{target}: name a pod or give -l SELECTOR, not both")
    if not m.group("pod") and not selector:
        raise ValueError(f"{target}: name the pod (k8s:{ns or ''}/POD) or select pods with -l SELECTOR")
    return PodTarget(ns or namespace or "", m.group("pod"), m.group("container"), selector)


def with_namespace(t: PodTarget, reader: "KubeReader") -> PodTarget:
    """``t`` with its namespace, the kubeconfig context's when the target left it empty (kubectl's rule)."""
    return t if t.namespace else replace(t, namespace=reader.default_namespace())


@dataclass
class KubeReader:
    """The client calls kvaudit makes, with their records. ``kubeconfig``: a file, else ``KUBECONFIG`` /
    ``~/.kube/config``, else the in-cluster service account."""

    kubeconfig: str | None = None
    timeout_s: float = 30.0
    records: list[CommandRecord] = field(default_factory=list)
    #: the kubeconfig context to use (kubectl's --context); None: the current context
    context: str | None = None
    _api: Any = None
    #: when the host's deadline started: every request, log stream and exec of this target shares it
    started: float = field(default_factory=time.monotonic)

    def remaining(self, what: str) -> float:
        """Seconds left of the host's deadline; past it, :class:`HostTimeout` naming what was next."""
        left = self.timeout_s - (time.monotonic() - self.started)
        if left <= 0:
            raise HostTimeout(f"the Kubernetes API target took longer than its {self.timeout_s:g} s deadline "
                              f"(before: {what})")
        return left

    def api(self) -> Any:
        if self._api is None:
            self._api = _core_api(self.kubeconfig, self.context)
        return self._api

    def default_namespace(self) -> str:
        return _context_namespace(self.kubeconfig, self.context)

    def call(self, verb: str, resource: str, ns: str, detail: str, fn: Callable[..., Any], *args: Any,
             **kw: Any) -> Any:
        """One API request, recorded as ``VERB RESOURCE NS...``; a refusal names the verb and resource."""
        import time

        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError as Urllib3Error

        what = f"{verb} {resource} {ns}{detail}"
        left = self.remaining(what)
        start = time.monotonic()
        try:
            out = fn(*args, _request_timeout=(min(10.0, left), left), **kw)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            # the client's models refuse what no API server sends (a required field null, a field of another
            # type, a document nested past the parser's depth): the server's fault, said in kvaudit's words
            self.records.append(CommandRecord(what, None, 0, time.monotonic() - start))
            raise BadAnswer(f"the Kubernetes API's answer to '{what}' is not a valid Kubernetes object "
                            f"({type(exc).__name__}: {printable(str(exc))[:200]})") from None
        except ApiException as exc:
            self.records.append(CommandRecord(what, exc.status, 0, time.monotonic() - start))
            raise _api_error(exc, what, verb, resource, ns) from None
        except Urllib3Error as exc:
            self.records.append(CommandRecord(what, None, 0, time.monotonic() - start))
            text = printable(str(exc))
            if "timed out" in text.lower():
                raise HostTimeout(f"the Kubernetes API did not answer within {self.timeout_s:g} s ({what})") from None
            raise Unreachable(f"the Kubernetes API is unreachable ({what}): {text[:300]}") from None
        self.records.append(CommandRecord(what, 200, len(out) if isinstance(out, (bytes, str)) else 0,
                                          time.monotonic() - start))
        return out

    def pod(self, ns: str, name: str) -> Any:
        return _valid_pod(self.call("get", "pods", ns, f"/{name}", self.api().read_namespaced_pod, name, ns),
                          f"get pods {ns}/{name}")

    def pods(self, ns: str, selector: str, node: str | None = None) -> list[Any]:
        """The pods ``-l selector`` names; with ``node``, only those scheduled there (the API's field selector
        ``spec.nodeName``, so a node auditing itself lists its own pods, however large the cluster)."""
        if node is not None and not _NAME.fullmatch(node):
            raise KubeError(f"--node {node!r}: a node name is a lower-case DNS name")
        extra = {"field_selector": f"spec.nodeName={node}"} if node else {}
        found = self.call("list", "pods", ns, f" -l {selector}" + (f" on {node}" if node else ""),
                          self.api().list_namespaced_pod, ns, label_selector=selector, **extra)
        items = getattr(found, "items", None) or []
        if not isinstance(items, list):
            raise BadAnswer(f"the Kubernetes API's pod list for '-l {selector}' in {ns} is not a list")
        return [_valid_pod(p, f"list pods {ns} -l {selector}") for p in items]

    def log_lines(self, ns: str, name: str, container: str, previous: bool, anchors: tuple[bytes, ...]
                  ) -> tuple[list[tuple[int, str]], int, int]:
        """The log's selected lines (:func:`lines_of`), how many flooded lines were skipped, and the bytes read.
        The response is scanned as it streams in: a pod's log is never held whole (the DaemonSet's command on 8
        pods with 64 MiB logs held 8 of them at once: 715 MiB against its 384 MiB limit)."""
        resp = self.call("get", "pods/log", ns, f"/{name} container={container}" + (" previous" if previous else ""),
                         self.api().read_namespaced_pod_log, name, ns, container=container, timestamps=True,
                         limit_bytes=LOG_LIMIT_BYTES, previous=previous, _preload_content=False)
        # the read timeout bounds one read; a log that drips a byte at a time passes every one of them. The host's
        # deadline bounds the whole read: a watchdog ends it (urllib3's shutdown() interrupts a blocked read)
        dog = Watchdog(self.remaining(f"reading the log of {ns}/{name}"), lambda: _interrupt(resp))
        body = _Capped(resp, LOG_LIMIT_BYTES)
        try:
            with dog:
                lines, flooded = lines_of(body, anchors)
        finally:
            resp.release_conn()
        if body.failed is not None and not dog.fired:
            raise body.failed  # the transport's own error, as a read of the whole body raised it before
        if dog.fired:
            raise HostTimeout(f"the Kubernetes API did not send the whole log of {ns}/{name} within the "
                              f"{self.timeout_s:g} s deadline (it streamed too slowly, or without end)")
        last = self.records[-1]
        self.records[-1] = replace(last, bytes_received=body.read_bytes, truncated=body.read_bytes >= LOG_LIMIT_BYTES)
        return lines, flooded, body.read_bytes


class _Capped:
    """A streamed response read by the scanner's feeder thread: at most ``limit`` bytes, and a read the watchdog
    interrupted (or any error of the transport) ends the stream instead of raising in that thread."""

    def __init__(self, resp: Any, limit: int):
        self.resp, self.left, self.read_bytes = resp, limit, 0
        self.failed: BaseException | None = None

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0 or self.failed is not None:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        try:
            block = self.resp.read(n)
        except Exception as exc:  # noqa: BLE001 - the read the watchdog interrupted, in whatever way urllib3 says
            self.failed = exc
            return b""
        self.left -= len(block)
        self.read_bytes += len(block)
        return block


def _interrupt(resp: Any) -> None:
    """End a blocked read of a streamed response from another thread."""
    try:
        if hasattr(resp, "shutdown"):  # urllib3 2.3+
            resp.shutdown()
            return
        sock = getattr(getattr(resp, "_connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace kubectl would use without -n: the context's, else the in-cluster service account's, else
    ``default``."""
    try:
        from kubernetes import config

        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
        ns = ((chosen or {}).get("context") or {}).get("namespace")
        if isinstance(ns, str) and _NAME.fullmatch(ns):
            return ns
        return "default"
    except Exception:  # no kubeconfig (in-cluster), or one the client cannot read: the API call will say why
        try:
            ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
            return ns if _NAME.fullmatch(ns) else "default"
        except OSError:
            return "default"


def _core_api(kubeconfig: str | None, context: str | None = None) -> Any:
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise KubeError("reading pods needs the Kubernetes client: pip install 'kvaudit[k8s]'") from None
    import logging

    import yaml  # type: ignore[import-untyped,unused-ignore]

    # urllib3 logs each retry as a WARNING on stderr: kvaudit reports the outcome in its own one line
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    cfg = client.Configuration()
    try:
        if kubeconfig is None and context is None:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (ConfigException, OSError):
                config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as exc:
        where = kubeconfig or "KUBECONFIG, ~/.kube/config or the in-cluster service account"
        raise KubeError(f"no usable kubeconfig ({where}): {printable(str(exc)).splitlines()[0][:300]}") from None
    cfg.retries = 1  # one retry for a blip; a down API server is said within the deadline, not after three
    return client.CoreV1Api(client.ApiClient(cfg))


def _valid_pod(pod: Any, what: str) -> Any:
    """The pod as the API server answered it, if it is one kvaudit can read: a name and containers with names, all
    as Kubernetes admits them (the client leaves optional fields null; a hostile server may fill them with
    anything)."""
    meta, spec = getattr(pod, "metadata", None), getattr(pod, "spec", None)
    name = getattr(meta, "name", None)
    containers = getattr(spec, "containers", None)
    ok = (isinstance(name, str) and _NAME.fullmatch(name) is not None and isinstance(containers, list)
          and bool(containers) and all(isinstance(getattr(c, "name", None), str) and _NAME.fullmatch(c.name)
                                       for c in containers))
    if not ok:
        raise BadAnswer(f"the Kubernetes API's answer to '{what}' is not a pod kvaudit can read (a pod needs a "
                        "name and named containers, as Kubernetes admits them)")
    return pod


def _api_error(exc: Any, what: str, verb: str, resource: str, ns: str) -> CollectError:
    message = ""
    try:
        import json

        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError, RecursionError):  # a body nested past the parser's depth is no message
        pass
    message = printable(message or str(exc.reason or ""))[:300]
    if exc.status == 404:
        return NotFound(f"not found ({what}): {message}")
    if exc.status == 403:
        return Forbidden(f"forbidden: kvaudit needs '{verb}' on '{resource}' in namespace '{ns}' (RBAC; see "
                         f"contrib/kubernetes/role.yaml): {message}")
    if exc.status == 401:
        return AuthFailed(f"the Kubernetes API refused the credentials ({what}): {message}")
    return Unreachable(f"the Kubernetes API answered {exc.status} ({what}): {message}")


# ------------------------------------------------------------------------------------------------------------


def _container(pod: Any, wanted: str | None, engine_names: tuple[str, ...]) -> str:
    names = [c.name for c in pod.spec.containers]
    if wanted:
        if wanted not in names:
            raise NotFound(f"pod {pod.metadata.name} has no container {wanted!r} (it has: {', '.join(names)})")
        return wanted
    for c in pod.spec.containers:  # the engine's own container, told by its name or image
        text = f"{c.name} {c.image or ''}".lower()
        if any(n in text for n in engine_names):
            return c.name
    return names[0]


def _restarts(pod: Any, container: str) -> int:
    for s in (pod.status.container_statuses or []) if pod.status else []:
        if s.name == container:
            return int(s.restart_count or 0)
    return 0


def endpoint_hint(pod: Any, container: str) -> str:
    """The server's own endpoint, to audit when the startup is gone from the log."""
    ip = pod.status.pod_ip if pod.status else None
    port = next((p.container_port for c in pod.spec.containers if c.name == container for p in (c.ports or [])),
                None)
    return f"http://{ip}:{port}" if ip and port else "http://POD_IP:PORT"


def merge(logs: list[list[tuple[int, str]]]) -> list[tuple[int, str]]:
    """Several pods' selected lines as one sequence in time order (each line carries its ``timestamps=true``
    prefix; a line without one keeps its place after the line before it), numbered in that order. Stable: equal
    times keep their pod order. Only the selected lines are merged (a group of 64 MiB logs of short lines was
    every line of every pod in memory at once: 8 GB for eight pods)."""
    keyed = []
    for i, lines in enumerate(logs):
        last = b""
        for n, (_, text) in enumerate(lines):
            m = _STAMP.match(text.encode("utf-8", "replace"))
            if m:
                last = _utc_key(m.group(1))
            keyed.append((last, i, n, text))
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [(number, k[3]) for number, k in enumerate(keyed, 1)]


def _utc_key(stamp: bytes) -> bytes:
    """The kubelet writes RFC 3339 UTC with up to nine fraction digits (``...T10:00:00.5Z``): padded to nine,
    the stamps sort as text. Another offset (a hand-made file) sorts by its text as it is."""
    base, _, frac = stamp.rstrip(b"Z").partition(b".")
    return base + b"." + frac.ljust(9, b"0") if stamp.endswith(b"Z") else stamp


@record
class PodLog:
    """The selected lines of the pod's (or the group's, merged) log, and how many bytes were read for them."""

    lines: tuple[tuple[int, str], ...]
    bytes_read: int
    source: str
    notes: tuple[str, ...]
    pods: tuple[Any, ...]
    container: str


def read_logs(reader: KubeReader, target: PodTarget, engine_names: tuple[str, ...], anchors: tuple[bytes, ...],
              has_startup: Callable[[list[tuple[int, str]]], bool]) -> PodLog:
    """The pod's (or the group's) selected log lines, from the latest instances; a container whose latest instance
    has no startup is read from its previous instance when it has one. Each pod's log is reduced to its selected
    lines as soon as it is read."""
    if target.pod:
        pods = [reader.pod(target.namespace, target.pod)]
    else:
        pods = reader.pods(target.namespace, target.selector or "")
        if not pods:
            raise NotFound(f"no pod in namespace {target.namespace} matches -l {target.selector}")
        if len(pods) > MAX_PODS:
            raise KubeError(f"-l {target.selector} selects {len(pods)} pods in {target.namespace} (at most "
                            f"{MAX_PODS}): narrow the selector to one server's group")
    pods.sort(key=lambda p: p.metadata.name)
    container = _container(pods[0], target.container, engine_names)
    notes: list[str] = []
    logs: list[list[tuple[int, str]]] = []
    read = 0
    for pod in pods:
        c = container if container in [x.name for x in pod.spec.containers] else _container(pod, None, engine_names)
        lines, flooded, n = reader.log_lines(target.namespace, pod.metadata.name, c, False, anchors)
        read += n
        restarts = _restarts(pod, c)
        if not has_startup(lines) and restarts > 0:
            prev_lines, prev_flooded, n = reader.log_lines(target.namespace, pod.metadata.name, c, True, anchors)
            read += n
            if has_startup(prev_lines):
                notes.append(f"pod {pod.metadata.name}: container {c} restarted ({restarts}x) and its latest "
                             "instance holds no startup: read the previous instance's log (previous=true); the "
                             "running server may differ from it")
                lines, flooded = prev_lines, prev_flooded
        if flooded:
            notes.append(f"pod {pod.metadata.name}: {flooded:,} memory lines in the middle of a flood of them were "
                         "skipped (the first and last 10,000 are read)")
        logs.append(lines)
    names = ", ".join(p.metadata.name for p in pods)
    source = (f"k8s pod {target.namespace}/{pods[0].metadata.name} container={container}" if target.pod else
              f"k8s pods {target.namespace} -l {target.selector} ({names}) container={container}")
    if any("previous instance" in n for n in notes):
        source += " (previous instance)"
    merged = logs[0] if len(logs) == 1 else merge(logs)
    return PodLog(tuple(merged), read, source, tuple(notes), tuple(pods), container)


def collected(target: str, log: PodLog, lines: list[tuple[int, str]], records: list[CommandRecord],
              partial: list[str]) -> Collected:
    return Collected(target=target, host=None, source=log.source, log_lines=tuple(lines), gpus=(), apps=(),
                     config_json=None, config_source=None, server_pids=(), commands=tuple(records),
                     partial=tuple(partial), collected_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def no_startup(target: PodTarget, log: PodLog) -> NoEngineFound:
    hint = endpoint_hint(log.pods[0], log.container)
    return NoEngineFound(
        f"{target}: no engine startup in the container's log ({log.bytes_read:,} bytes read): the kubelet rotates "
        f"container logs and the API returns only the newest file, so on a busy server the startup is gone "
        f"within hours; audit the live server from its own endpoints instead: kvaudit check {hint}")


def lines_of(data: "bytes | _Capped", anchors: tuple[bytes, ...]) -> tuple[list[tuple[int, str]], int]:
    """The selected lines of one pod's log (its bytes, or its response as it streams in), bounded as a file's are
    (the first and last FLOOD_KEEP: a log of short anchor lines must not become millions of objects per pod),
    and how many were skipped between them."""
    from kvaudit.parse.lines import InputError, ScanStats, bounded_lines, scan_fast

    stats = ScanStats()
    stream = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        lines = [(ln.number, ln.text) for ln in bounded_lines(scan_fast(stream, anchors, stats),  # type: ignore[arg-type]
                                                              stats)]
    except InputError:
        return [], 0
    return lines, stats.flooded_lines


# ------------------------------------------------------------------------------------------------------------
# GPU readings and the model's config from inside the container (pods/exec, when RBAC allows it)


class ExecForbidden(CollectError):
    reason = "forbidden"


class PodExecRunner:
    """A :class:`~kvaudit.collect.interface.Runner` that runs kvaudit's read-only commands in the engine's
    container through ``pods/exec`` (a websocket, ``v4/v5.channel.k8s.io``): the same gated command lines as
    over SSH, passed as an argv (no shell in between). Output is bounded like SSH's; stdin is never opened."""

    def __init__(self, reader: KubeReader, namespace: str, pod: str, container: str):
        self.reader, self.namespace, self.pod, self.container = reader, namespace, pod, container

    def run(self, command: str, timeout: float, max_bytes: int):
        import shlex
        import time

        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream

        from kvaudit.collect.interface import CommandResult

        argv = shlex.split(command)
        start = time.monotonic()
        what = f"create pods/exec {self.namespace}/{self.pod} container={self.container}: {argv[0]}"
        # each command has its own timeout, and all of them share the host's deadline (several commands at 30 s
        # each took 129 s under --timeout 30)
        timeout = min(timeout, self.reader.remaining(what))
        try:
            ws = stream(self.reader.api().connect_get_namespaced_pod_exec, self.pod, self.namespace,
                        container=self.container, command=argv, stdin=False, stdout=True, stderr=True, tty=False,
                        binary=True, _preload_content=False, _request_timeout=timeout)
        except ApiException as exc:
            self.reader.records.append(CommandRecord(what, None, 0, time.monotonic() - start))
            code, said = exec_refusal(exc)
            if code == 403:
                raise ExecForbidden(f"no GPU readings: RBAC does not allow 'create' on 'pods/exec' in namespace "
                                    f"'{self.namespace}' (kvaudit reads nvidia-smi in the container when it does)"
                                    ) from None
            raise ExecForbidden(f"no GPU readings: the API server refused the exec stream ({said})") from None
        except Exception as exc:  # noqa: BLE001 - the websocket library's own (a reset, TLS): said in our words
            self.reader.records.append(CommandRecord(what, None, 0, time.monotonic() - start))
            raise ExecForbidden(f"no GPU readings: the exec stream could not be opened ({type(exc).__name__})"
                                ) from None
        out, err, status = bytearray(), bytearray(), bytearray()
        truncated = closed = False
        # the client's update() reads every frame already available before it returns, whole, and keeps two copies:
        # a server that floods stdout or announces a 2 GiB frame held the run in there (776 MB at 600 s, 6 GB).
        # The frames are read here one at a time, each bounded before its payload is read, and the whole exchange
        # by the command's share of the host deadline (a watchdog closes the socket)
        sock = ws.sock
        cap = max(max_bytes, 64 << 10) + (64 << 10)
        _bound_frames(sock, cap)
        dog = Watchdog(max(0.0, timeout - (time.monotonic() - start)), lambda: _shut(sock))
        try:
            with dog:
                while not closed:
                    try:
                        opcode, frame = sock.recv_data_frame(True)
                    except _OversizedFrame as exc:
                        raise ExecForbidden(f"no GPU readings: pods/exec sent a frame of {exc.size:,} bytes, over "
                                            f"kvaudit's bound of {cap:,} (nvidia-smi prints kilobytes)") from None
                    except Exception:  # noqa: BLE001 - the read the watchdog interrupted, or a connection that ended
                        if dog.fired:
                            break
                        closed = True
                        break
                    if opcode == 0x8:  # close
                        closed = True
                        break
                    data = bytes(frame.data or b"")
                    if not data:
                        continue
                    channel, payload = data[0], data[1:]
                    if channel == 1:
                        out += payload
                        if len(out) > max_bytes:
                            truncated = True
                            del out[max_bytes:]
                            break
                    elif channel == 2:
                        err += payload[:max(0, (16 << 10) - len(err))]
                    elif channel == 3:
                        status += payload[:max(0, (64 << 10) - len(status))]
            rc = _exit_code(bytes(status), err) if status or (closed and not dog.fired) else None
        finally:
            if not closed or dog.fired:
                # websocket-client's close() waits up to 3 s for the server's close frame and reads whatever comes
                # first, a refused frame's payload included (its length is already read, so the bound above no
                # longer sees it: a frame announcing 16 GiB was read whole, 5 GB past the deadline): an exchange
                # that did not end cleanly is cut at the socket, with no closing handshake
                _abort(sock)
            ws.close()
        return CommandResult(command, rc, bytes(out), bytes(err), time.monotonic() - start, truncated)

    def run_batch(self, commands: list[str], timeout: float, max_bytes: int):
        return [self.run(c, timeout, max_bytes) for c in commands]

    def close(self) -> None:
        pass


_HANDSHAKE = re.compile(r"Handshake status (\d{3})\s*([A-Za-z][A-Za-z ]{0,40})?")
_MESSAGE = re.compile(r"""["']message["']\s*:\s*["']([^"'\\]{1,300})""")


def exec_refusal(exc: Any) -> tuple[int | None, str]:
    """What an exec stream's refusal says, in a line: the HTTP status the API server answered the upgrade with and
    its Status message. websocket-client reports a refused upgrade as "Handshake status 500 Internal Server Error
    -+-+- {every response header} -+-+- b'{the body}'", which the kubernetes client passes on as the reason; only
    the status and the body's message are kept (a response header may hold anything, "403" included)."""
    text = printable(str(getattr(exc, "reason", None) or exc))
    m = _HANDSHAKE.search(text)
    code = int(m.group(1)) if m else (exc.status if isinstance(getattr(exc, "status", None), int) and exc.status
                                      else None)
    msg = _MESSAGE.search(text)
    said = (f"HTTP {code}" + (f" {m.group(2).strip()}" if m and m.group(2) else "") if code else "no HTTP status")
    return code, said + (f": {msg.group(1)}" if msg else ("" if m else f": {text[:120]}"))


class _OversizedFrame(Exception):
    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


def _bound_frames(sock: Any, cap: int) -> None:
    """Refuse a websocket frame, or a message of continuation frames, longer than ``cap`` bytes before its payload
    is read (websocket-client reads a frame whole, of the length its header announces)."""
    frames, fragments = sock.frame_buffer, sock.cont_frame
    read_length, add = frames.recv_length, fragments.add

    def recv_length() -> None:
        read_length()
        if frames.length is not None and frames.length > cap:
            raise _OversizedFrame(frames.length)

    def add_fragment(frame: Any) -> None:
        held = len(fragments.cont_data[1]) if fragments.cont_data else 0
        if held + len(frame.data) > cap:
            raise _OversizedFrame(held + len(frame.data))
        add(frame)

    frames.recv_length = recv_length
    fragments.add = add_fragment


def _shut(sock: Any) -> None:
    """End a blocked read on the exec websocket (the watchdog's deadline)."""
    try:
        sock.sock.shutdown(socket.SHUT_RDWR)
    except (OSError, AttributeError):
        pass


def _abort(sock: Any) -> None:
    """Drop the exec websocket at once: no close frame is awaited, nothing more is read."""
    _shut(sock)
    try:
        sock.shutdown()  # websocket-client: closes the socket and marks it not connected (close() then reads nothing)
    except Exception:  # noqa: BLE001 - a socket already gone
        pass


def _exit_code(status: bytes | str, err: bytearray) -> int | None:
    """The exit status from the exec's error channel (a Status object): Success -> 0, ``ExitCode`` cause -> its
    value; a failure to start the command (``executable file not found``) -> 127 with the message in ``err``."""
    import json

    try:
        doc = json.loads(status or b"null")
    except (ValueError, RecursionError):  # a Status nested past the parser's depth: no exit status from it
        doc = None
    if not isinstance(doc, dict):
        return None
    if doc.get("status") == "Success":
        return 0
    for cause in (doc.get("details") or {}).get("causes") or []:
        if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
            try:
                return int(str(cause.get("message")))
            except (TypeError, ValueError):
                break
    message = printable(str(doc.get("message") or ""))[:500]
    err += ("\n" + message).encode()
    return 127 if "not found" in message or "no such file" in message.lower() else 1
