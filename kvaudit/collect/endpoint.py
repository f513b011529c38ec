"""A live server's own HTTP endpoints, for when its startup log is gone (rotated away, a pod restarted).

Read-only GETs, each bounded in time and size, no redirects followed (a server that redirects is not
answering for itself), nothing sent but the request line and ``Accept``. Which documents are read, and what
they mean, is each engine's business: each names its paths in ``engines.py`` (``Engine.endpoint_paths``) and
reads them in ``reconcile/<engine>/endpoint.py``; this module only fetches them (docs/endpoints.md).
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import field
from datetime import datetime, timezone

from kvaudit.collect.interface import CollectError, CommandRecord, HostTimeout, Unreachable
from kvaudit.collect.watchdog import Watchdog
from kvaudit.targets import is_endpoint  # noqa: F401  (defined where telling it loads nothing: kvaudit.targets)
from kvaudit.textsafe import printable
from kvaudit.record import record

#: what one endpoint may return: a /metrics page of a big server is ~100 KiB, /server_info a few KiB
MAX_DOCUMENT_BYTES = 8 << 20


class NotAnEndpoint(CollectError):
    reason = "not_inference_server"  # it answers HTTP, but none of the engines' documents


@record
class Document:
    path: str
    status: int  # the HTTP status; 0 when the request got no answer
    body: str = field(repr=False)
    content_type: str = ""


@record
class EndpointCapture:
    """What a server's endpoints returned: the documents by path, and a record of every request."""

    url: str  # the base URL, as normalised (scheme://host:port, no path)
    documents: tuple[Document, ...]
    requests: tuple[CommandRecord, ...]
    collected_at: str

    def get(self, path: str) -> str | None:
        """The body of ``path`` when it answered 200, else None."""
        for d in self.documents:
            if d.path == path and d.status == 200:
                return d.body
        return None


def base_url(target: str) -> str:
    """``http://host:port[/anything]`` -> ``http://host:port``; a bad URL is a clear error."""
    parts = urllib.parse.urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{target}: not an http:// or https:// URL with a host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{target}: the port is not a number in 1..65535") from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 - urllib's hook
        return None  # the 3xx comes back as an HTTPError: recorded, not followed


class _Sockets:
    """The sockets of one request, shut down together when its :class:`Watchdog` fires (a server that drips its
    headers or body, or sends ``100 Continue`` without end, passes every socket read timeout)."""

    def __init__(self) -> None:
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            if sock is None:
                return
            self._socks.append(sock)
            if self._closed:
                self._close(sock)

    def close_all(self) -> None:
        with self._lock:
            self._closed = True
            for sock in self._socks:
                self._close(sock)

    @staticmethod
    def _close(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked recv in the reading thread
        except OSError:
            pass


def _watched(base: type, socks: _Sockets) -> type:
    class Connection(base):  # type: ignore[misc, valid-type]
        def connect(self) -> None:
            super().connect()
            socks.watch(self.sock)

    return Connection


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, socks: _Sockets):
        super().__init__()
        self.socks = socks

    def http_open(self, req):  # noqa: D102 - urllib's hook
        return self.do_open(_watched(http.client.HTTPConnection, self.socks), req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, socks: _Sockets):
        super().__init__()
        self.socks = socks

    def https_open(self, req):  # noqa: D102 - urllib's hook
        kwargs = {"context": self._context}
        if hasattr(self, "_check_hostname"):  # Python 3.11 passes it; 3.12 dropped the argument
            kwargs["check_hostname"] = self._check_hostname
        return self.do_open(_watched(http.client.HTTPSConnection, self.socks), req, **kwargs)


def fetch(target: str, documents: tuple[tuple[str, ...], ...], deadline_s: float = 30.0) -> EndpointCapture:
    """GET each document once, in order: each is a tuple of the paths it has been served at, newest name first
    (a 404 is an answer, not a failure; an older name is asked only when the newer one is not served).
    Raises :class:`Unreachable` when the server does not answer at all (refused, DNS, TLS),
    :class:`HostTimeout` past the deadline, :class:`NotAnEndpoint` when it answers none of the paths."""
    url = base_url(target)
    deadline = time.monotonic() + deadline_s
    docs: list[Document] = []
    records: list[CommandRecord] = []
    for path, aliases in ((p, names) for names in documents for p in names):
        if any(d.path in aliases and d.status == 200 for d in docs):
            continue  # served under a newer name already
        left = deadline - time.monotonic()
        if left <= 0:
            raise HostTimeout(f"{url}: no answer within the {deadline_s:g} s deadline (while reading {path})")
        start = time.monotonic()
        socks = _Sockets()
        with Watchdog(left, socks.close_all) as dog:
            opener = urllib.request.build_opener(_NoRedirect(), _HTTP(socks), _HTTPS(socks))
            try:
                status, body, ctype = _get(opener, url + path, min(left, 15.0))
            except CollectError:
                if dog.fired:
                    raise HostTimeout(f"{url}: no whole answer within the {deadline_s:g} s deadline (while reading "
                                      f"{path}: the server sent too slowly, or without end)") from None
                raise
        if dog.fired:
            raise HostTimeout(f"{url}: no whole answer within the {deadline_s:g} s deadline (while reading {path})")
        records.append(CommandRecord(f"GET {url}{path}", status, len(body), time.monotonic() - start,
                                     len(body) > MAX_DOCUMENT_BYTES))
        docs.append(Document(path, status, body[:MAX_DOCUMENT_BYTES].decode("utf-8", "replace"), ctype))
    if not any(d.status == 200 for d in docs):
        seen = ", ".join(f"{d.path} {d.status}" for d in docs)
        raise NotAnEndpoint(f"{url}: answers HTTP but serves none of the engines' documents ({seen}); "
                            "give the server's own port (SGLang --port, vLLM --port, trtllm-serve --port, "
                            "LMDeploy --server-port)")
    return EndpointCapture(url, tuple(docs), tuple(records),
                           datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _get(opener, url: str, timeout: float) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, headers={"Accept": "application/json, text/plain;q=0.9, */*;q=0.1",
                                               "User-Agent": "kvaudit"})
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read(MAX_DOCUMENT_BYTES + 1), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        try:
            body = exc.read(64 << 10)
        except (OSError, ValueError):
            body = b""
        return exc.code, body, exc.headers.get("Content-Type", "") if exc.headers else ""
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            raise HostTimeout(f"{url}: no answer within {timeout:.0f} s") from None
        raise Unreachable(f"{url}: {printable(str(getattr(reason, 'strerror', None) or reason))}") from None
    except (socket.timeout, TimeoutError):
        raise HostTimeout(f"{url}: no answer within {timeout:.0f} s") from None
    except (OSError, ValueError) as exc:  # a reset connection, a malformed status line
        raise Unreachable(f"{url}: {printable(str(exc))}") from None
    except http.client.HTTPException as exc:
        # http.client's own: a status line that is not HTTP, a header line over 64 KiB, more than 100 headers, a
        # bad chunk, a body cut short. The server's fault, said in kvaudit's words, never an internal error
        what = {"BadStatusLine": "the answer is not HTTP (bad status line)",
                "LineTooLong": "a header or status line longer than HTTP clients accept",
                "IncompleteRead": "the body was cut short or its chunked encoding is broken",
                "HTTPException": "a malformed HTTP answer"}.get(type(exc).__name__,
                                                                 f"a malformed HTTP answer ({type(exc).__name__})")
        raise Unreachable(f"{url}: {what}") from None
