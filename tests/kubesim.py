"""A Kubernetes API server on loopback for the tests: a real HTTP server answering the documented core/v1 paths
kvaudit reads (``GET pods``, ``GET pods/log`` with ``container``, ``previous``, ``timestamps``,
``limitBytes``; ``GET pods?labelSelector=``) with real-shaped objects (Pod, PodList, Status 401/403/404/400),
and a kubeconfig that points the official client at it with a bearer token."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

from tests.endpointsim import listening

TOKEN = "kvaudit-test-token"


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[tuple[str, str, int]]  # (name, image, containerPort)
    logs: dict[tuple[str, bool], str]  # (container, previous) -> log text with RFC 3339 timestamps
    labels: dict[str, str] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    pod_ip: str = "10.1.2.3"
    #: what a command run in the container (pods/exec) gives: argv -> (exit code, stdout, stderr); None: the
    #: container has no such program (Kubernetes' "executable file not found" failure)
    execute: Callable[[list[str]], tuple[int, bytes, bytes] | None] | None = None
    #: seconds between the bytes of this pod's log: a log stream that drips without end (no Content-Length,
    #: the text then "." forever), each byte well within any read timeout
    drip: float | None = None
    #: pods/exec accepts the websocket and never sends a frame (a hung container runtime)
    exec_hangs: bool = False
    #: the API server answers the exec upgrade with this HTTP status and a Status body (500: the kubelet
    #: unreachable, as a real API server says it), response headers and all
    exec_refused: int | None = None
    #: a hostile pods/exec: "frame" announces a 2 GiB stdout frame (and sends its first MiB), "whole" announces
    #: 1 GiB and sends all of it, "stdout" floods
    #: stdout with frames without end, "fragments" sends continuation frames of one message without end
    exec_flood: str | None = None
    #: fields that replace the pod object's (a malformed answer: {"spec": {"containers": None}}, a bad name)
    malformed: dict | None = None
    #: the node the pod runs on (spec.nodeName; a list's fieldSelector=spec.nodeName=X selects by it)
    node: str = "gpu-node-1"

    def obj(self) -> dict:
        doc = self._obj()
        for key, value in (self.malformed or {}).items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        return doc

    def _obj(self) -> dict:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": self.labels,
                         "uid": f"uid-{self.name}", "creationTimestamp": "2026-11-29T10:00:00Z"},
            "spec": {"containers": [{"name": n, "image": img, "ports": [{"containerPort": p, "protocol": "TCP"}]}
                                    for n, img, p in self.containers], "nodeName": self.node},
            "status": {"phase": "Running", "podIP": self.pod_ip, "containerStatuses": [
                {"name": n, "image": img, "imageID": f"docker.io/{img}@sha256:00", "ready": True,
                 "restartCount": self.restarts.get(n, 0), "containerID": f"containerd://{n}",
                 "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}, "lastState": {}}
                for n, img, _ in self.containers]},
        }


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "details": details or {}, "code": code}


@contextmanager
def api_server(pods: list[FakePod], forbidden: set[str] = frozenset()) -> Iterator[tuple[str, list[str]]]:
    """Serve ``pods``. ``forbidden``: resources (``pods``, ``pods/log``) the caller may not ``get``/``list``.
    Yields the base URL and the request lines seen (method and path with query)."""
    seen: list[str] = []
    by_key = {(p.namespace, p.name): p for p in pods}
    namespaces = {p.namespace for p in pods}

    class Handler(BaseHTTPRequestHandler):
        def send_json(self, code: int, doc: dict) -> None:
            data = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            seen.append(f"GET {self.path}")
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                return self.send_json(401, _status(401, "Unauthorized", "Unauthorized"))
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/exec", url.path)
            if m:
                return self.exec(m.group(1), m.group(2), parse_qs(url.query))
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?", url.path)
            if not m:
                return self.send_json(404, _status(404, "NotFound", "the server could not find the requested resource"))
            ns, name, is_log = m.group(1), m.group(2), bool(m.group(3))
            resource = "pods/log" if is_log else "pods"
            verb = "get" if name else "list"
            if resource in forbidden:
                return self.send_json(403, _status(403, "Forbidden", (
                    f'pods "{name}" is forbidden: ' if name else "pods is forbidden: ")
                    + f'User "system:serviceaccount:{ns}:kvaudit" cannot {verb} resource "{resource.split("/")[0]}"'
                    + (' subresource "log"' if is_log else "") + f' in API group "" in the namespace "{ns}"',
                    {"name": name or "", "kind": "pods"}))
            if ns not in namespaces and name is None:
                return self.send_json(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []})
            if name is None:
                sel = dict(kv.split("=", 1) for kv in q.get("labelSelector", "").split(",") if "=" in kv)
                fields = dict(kv.split("=", 1) for kv in q.get("fieldSelector", "").split(",") if "=" in kv)
                items = [p.obj() for p in pods if p.namespace == ns and all(p.labels.get(k) == v for k, v in sel.items())
                         and fields.get("spec.nodeName", p.node) == p.node]
                return self.send_json(200, {"kind": "PodList", "apiVersion": "v1",
                                            "metadata": {"resourceVersion": "1"}, "items": items})
            pod = by_key.get((ns, name))
            if pod is None:
                return self.send_json(404, _status(404, "NotFound", f'pods "{name}" not found',
                                                   {"name": name, "kind": "pods"}))
            if not is_log:
                return self.send_json(200, pod.obj())
            container = q.get("container") or pod.containers[0][0]
            if container not in [c[0] for c in pod.containers]:
                return self.send_json(400, _status(400, "BadRequest",
                                                   f"container {container} is not valid for pod {name}"))
            previous = q.get("previous") == "true"
            text = pod.logs.get((container, previous))
            if text is None:
                return self.send_json(400, _status(400, "BadRequest", f'previous terminated container "{container}" '
                                                   f'in pod "{name}" not found'))
            if q.get("timestamps") != "true":
                text = re.sub(r"(?m)^\S+Z ", "", text)
            data = text.encode()
            if pod.drip is not None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                try:
                    self.wfile.write(data[:200])
                    while True:
                        time.sleep(pod.drip)
                        self.wfile.write(b".")
                        self.wfile.flush()
                except OSError:
                    return  # the client closed: what its deadline should do
            if "limitBytes" in q:
                data = data[: int(q["limitBytes"])]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def exec(self, ns: str, name: str, q: dict[str, list[str]]) -> None:
            """pods/exec over a websocket (RFC 6455 handshake, v4/v5.channel.k8s.io): channel 1 stdout, 2
            stderr, 3 the Status; then a close frame."""
            if "pods/exec" in forbidden:
                return self.send_json(403, _status(403, "Forbidden", f'pods "{name}" is forbidden: cannot create '
                                                   f'resource "pods" subresource "exec" in the namespace "{ns}"'))
            pod = by_key.get((ns, name))
            if pod is None or "websocket" not in (self.headers.get("Upgrade") or "").lower():
                return self.send_json(404 if pod is None else 400, _status(400, "BadRequest", "upgrade required"))
            if pod.exec_refused:
                data = json.dumps(_status(pod.exec_refused, "InternalError", "error dialing backend: dial tcp "
                                          "10.0.0.5:10250: connect: connection refused")).encode()
                self.send_response(pod.exec_refused)
                for k, v in (("Audit-Id", "4031e3b6-0000-4000-8000-000000000403"), ("Cache-Control", "no-cache"),
                             ("Content-Type", "application/json"), ("Content-Length", str(len(data)))):
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
                return None
            argv = q.get("command", [])
            offered = [p.strip() for p in (self.headers.get("Sec-WebSocket-Protocol") or "").split(",")]
            proto = next(p for p in ("v5.channel.k8s.io", "v4.channel.k8s.io") if p in offered)
            accept = base64.b64encode(hashlib.sha1((self.headers["Sec-WebSocket-Key"] +
                                                    "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                             b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: "
                             + proto.encode() + b"\r\n\r\n")
            if pod.exec_flood:
                return self._flood(pod.exec_flood)
            if pod.exec_hangs:
                try:
                    while self.rfile.read(1):  # until the client gives up and closes
                        pass
                except OSError:
                    pass
                return
            result = pod.execute(argv) if pod.execute else None
            if result is None:
                status = _status(500, "InternalError", f'exec: "{argv[0] if argv else ""}": executable file not '
                                 "found in $PATH: unknown")
            else:
                rc, out, err = result
                for channel, data in ((1, out), (2, err)):
                    for i in range(0, len(data), 32 << 10):
                        self._frame(bytes([channel]) + data[i:i + (32 << 10)])
                status = {"metadata": {}, "status": "Success"} if rc == 0 else _status(
                    500, "NonZeroExitCode", f"command terminated with non-zero exit code: {rc}",
                    {"causes": [{"reason": "ExitCode", "message": str(rc)}]})
            self._frame(b"\x03" + json.dumps(status).encode())
            self.wfile.write(b"\x88\x02\x03\xe8")  # close, 1000
            self.wfile.flush()
            self.close_connection = True

        def _flood(self, kind: str) -> None:
            """Until the client closes: what a compromised API server or kubelet can send on an exec stream."""
            try:
                if kind == "frame":
                    self.wfile.write(b"\x82\x7f" + struct.pack(">Q", 2 << 30) + b"\x01")
                    for _ in range(16):
                        self.wfile.write(b"0" * (64 << 10))
                    self.wfile.flush()
                    while self.rfile.read(1):
                        pass
                elif kind == "whole":  # the frame's whole payload, as fast as the client takes it
                    self.wfile.write(b"\x82\x7f" + struct.pack(">Q", 1 << 30) + b"\x01")
                    chunk = b"0" * (1 << 20)
                    for _ in range(1 << 10):
                        self.wfile.write(chunk)
                    self.wfile.flush()
                elif kind == "stdout":
                    line = b"\x01" + b"0, GPU-0, H100, 00:19.0, 81559, 469, 74990, 6100, 580.95\n" * 500
                    while True:
                        self._frame(line)
                elif kind == "fragments":
                    self.wfile.write(b"\x02\x7e" + struct.pack(">H", 32 << 10) + b"\x01" + b"0" * ((32 << 10) - 1))
                    while True:  # continuation frames (opcode 0), never the last (FIN clear)
                        self.wfile.write(b"\x00\x7e" + struct.pack(">H", 32 << 10) + b"0" * (32 << 10))
            except OSError:
                return  # the client closed: what its bounds should make it do

        def _frame(self, payload: bytes) -> None:
            n = len(payload)
            head = (b"\x82" + bytes([n]) if n < 126 else b"\x82\x7e" + struct.pack(">H", n) if n < 65536
                    else b"\x82\x7f" + struct.pack(">Q", n))
            self.wfile.write(head + payload)

        def log_message(self, *args):
            pass

    with listening(Handler) as url:
        yield url, seen


def kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {server}
users:
- name: kvaudit
  user:
    token: {token}
contexts:
- name: test
  context:
    cluster: test
    user: kvaudit
    namespace: llm
current-context: test
""")
    return path


def pod_log(journal_lines: list[str]) -> str:
    """A journal excerpt (``2026-02-25T10:12:17+0000 host unit[pid]: MESSAGE``) as the container's own output
    with ``timestamps=true``: the kubelet's RFC 3339 UTC prefix, nanoseconds, then the message."""
    out = []
    for i, line in enumerate(journal_lines):
        m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\+0000 \S+ \S+: (.*)$", line)
        if m:
            out.append(f"{m.group(1)}.{i:09d}Z {m.group(2)}")
    return "\n".join(out) + "\n"
