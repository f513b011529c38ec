"""The fleet's HTML report in a real headless Chromium (issue 38, item 3), where one is installed: the table sorts
statuses by their order (not alphabetically) and host names naturally (gpu-2 before gpu-10); at a phone's width
(390 px) no element reaches past the page and the "why not ok" column is on screen. Chromium is driven over its
own DevTools protocol (websocket-client, already a dependency of the Kubernetes client)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import FIXTURES, cli

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (apt-get install chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Page:
    """One tab of a headless Chromium, driven by Runtime.evaluate."""

    def __init__(self, url: str, width: int, tmp) -> None:
        import websocket

        self.port = _free_port()
        self.proc = subprocess.Popen(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp}", f"--remote-debugging-port={self.port}", f"--window-size={width},900",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json", timeout=2).read())
                tab = next(t for t in tabs if t.get("type") == "page")
                break
            except Exception:  # noqa: BLE001 - the browser is still starting
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        self.ws = websocket.create_connection(tab["webSocketDebuggerUrl"], timeout=30)
        self.n = 0
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1,
                  mobile=width < 640)
        self.call("Page.navigate", url=url)
        for _ in range(100):
            if self.eval("document.readyState") == "complete" and self.eval("!!document.querySelector('#fleet')"):
                break
            time.sleep(0.1)

    def call(self, method: str, **params):
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                return msg.get("result", {})

    def eval(self, expr: str):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A fleet of gpu-2, gpu-10 and gpu-1 (Kimi captures, one with another tenant's process on a GPU) and a host
    that does not answer: the statuses failed, warning and ok, the names in no sorted order."""
    import importlib.util

    root = tmp_path_factory.mktemp("html")
    spec = importlib.util.spec_from_file_location("demo_fleet", FIXTURES.parent / "scripts" / "demo_fleet.py")
    demo = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(demo)
    hosts = [demo.capture_with(root, name) for name in ("gpu-2", "gpu-10", "gpu-1")]
    demo.with_foreign_process(hosts[1], 3, 77001, 6144)
    inv = root / "fleet.txt"
    inv.write_text("".join(f"{h}\n" for h in hosts) + "root@127.0.0.1:1\n")
    page = root / "report.html"
    cli("fleet", inv, "--html", page, "--no-config", "--timeout", "5")
    return page


def test_the_table_sorts_statuses_by_their_order_and_names_naturally(report, tmp_path):
    page = Page(report.as_uri(), 1280, tmp_path)
    try:
        def column(i: int) -> list[str]:
            return page.eval(f"Array.from(document.querySelectorAll('#fleet tbody tr')).map(r => "
                             f"r.cells[{i}].textContent.trim())")

        statuses = column(1)
        assert [s.split(":")[0] for s in statuses] == ["failed", "warning", "ok", "ok"], statuses  # problems first
        page.eval("document.querySelectorAll('#fleet th')[1].click()")  # ascending: the worst first
        assert [s.split(":")[0] for s in column(1)] == ["failed", "warning", "ok", "ok"]
        page.eval("document.querySelectorAll('#fleet th')[1].click()")  # descending: the best first
        assert [s.split(":")[0] for s in column(1)] == ["ok", "ok", "warning", "failed"]
        page.eval("document.querySelectorAll('#fleet th')[0].click()")
        names = [n.rsplit("/", 1)[-1] for n in column(0)]
        gpus = [n for n in names if n.startswith("gpu-")]
        assert gpus == ["gpu-1", "gpu-2", "gpu-10"], names  # natural order, not gpu-1, gpu-10, gpu-2
    finally:
        page.close()


def test_at_a_phone_s_width_nothing_overflows_and_why_is_on_screen(report, tmp_path):
    page = Page(report.as_uri(), 390, tmp_path)
    try:
        over = page.eval("Array.from(document.querySelectorAll('body *')).filter(e => "
                         "e.getBoundingClientRect().right > document.documentElement.clientWidth + 1 && "
                         "!e.closest('.wide')).map(e => e.tagName + '.' + e.className).slice(0, 5)")
        assert over == [], over
        assert page.eval("document.documentElement.scrollWidth <= document.documentElement.clientWidth + 1")
        why = page.eval("document.querySelector('#fleet td.why').getBoundingClientRect().right")
        assert why <= 390, why  # beside the status, not scrolled off to the right
        hidden = page.eval("getComputedStyle(document.querySelector('#fleet td.narrow-hide')).display")
        assert hidden == "none"
    finally:
        page.close()
