"""The web chat page at `/`, in headless Chromium against echo-server: the page sends a message given in its URL
fragment (#ask=...), streams the scripted answer, renders its markdown safely, folds the reasoning, shows the
model's name and context size, and Stop cancels the request on the server. Skipped only when Chromium cannot
run here."""
import base64
import html
import json
import os
import re
import select
import shutil
import struct
import subprocess
import time
import zlib

import pytest
import requests

from conftest import Server

REPLY = ("<think>The user greets me.</think>**Hi!** I am *scripted*. Some `code`:\n```\nx = 1 < 2\n```\n"
         "- one\n- two <b>not bold</b><script>alert(1)</script>")


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium driven through the DevTools protocol on a pipe (--remote-debugging-pipe: JSON
    messages ended by NUL, commands on its fd 3, answers and events on its fd 4): no extra Python package."""

    def __init__(self, width=1100, height=700):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-pipe", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=child_fds, close_fds=False)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id, self.session = b"", 0, None

    def call(self, method, timeout=30, session=True, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.time()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError(method)
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium exited")
            self._buf += chunk

    def open(self, url):
        target = self.call("Target.createTarget", session=False, url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", session=False, targetId=target, flatten=True)["sessionId"]
        deadline = time.time() + 30
        while self.eval("location.href + ' ' + document.readyState") != url + " complete":
            if time.time() > deadline:
                raise TimeoutError(f"{url} did not load")
            time.sleep(0.05)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    def wait_state(self, states, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            state = self.eval("document.body ? document.body.dataset.state : ''")
            if state in states:
                return state
            time.sleep(0.05)
        raise TimeoutError(f"page state stayed {state!r}")

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self):
        try:
            self.call("Browser.close", session=False, timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture
def browser():
    if not chromium():
        pytest.skip("chromium is not installed")
    try:
        b = Browser()
        b.open("data:text/html,<p>ok</p>")
        ok = b.eval("document.body.innerHTML") == "<p>ok</p>"
    except (OSError, RuntimeError, TimeoutError) as e:
        pytest.skip(f"chromium cannot run: {e}")
    if not ok:
        b.close()
        pytest.skip("chromium cannot run: it did not load a page")
    yield b
    b.close()


@pytest.fixture(scope="module")
def page_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("page") / "script.json"
    path.write_text(json.dumps({"Hello": REPLY, "Count": "1 2 3 4 5 6 7 8 9 10 " * 30}))
    s = Server("echo-server", "--script", str(path), "--reasoning-parser", "glm45", "--served-model-name",
               "echo-model", "--context-length", "3000", "--step-time-us", "2000")
    yield s
    s.stop()


def png_pixels_vary(path):
    """Whether a PNG's decoded scanlines hold more than a handful of byte values (not a blank image)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat))) > 20


def test_page_is_self_contained(page_server):
    r = requests.get(page_server.url + "/", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    page = r.text
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "default-src 'self'" in r.headers["Content-Security-Policy"]


def test_page_answers_in_chromium(browser, page_server, tmp_path):
    browser.open(page_server.url + "/#ask=Hello")
    assert browser.wait_state({"done", "error", "stopped"}) == "done"
    dom = browser.eval("document.documentElement.outerHTML")
    assert 'data-model="echo-model"' in dom and 'data-context="3000"' in dom
    assert "echo-model · context 3,000 tokens" in html.unescape(dom)
    answer = dom[dom.index('class="msg assistant"'):]
    # Markdown rendered; the model's HTML shown as text, never as markup.
    assert "<strong>Hi!</strong>" in answer and "<em>scripted</em>" in answer and "<code>code</code>" in answer
    assert "<pre><code>x = 1 &lt; 2" in answer and "<li>one</li>" in answer
    assert "&lt;b&gt;not bold&lt;/b&gt;&lt;script&gt;" in answer and "<b>" not in answer
    # The reasoning is folded away (a closed <details>), the answer outside it.
    m = re.search(r'<details class="reasoning"( open="")?><summary>Reasoning</summary><div>(.*?)</div>', answer)
    assert m and m.group(1) is None and m.group(2) == "The user greets me."
    assert "finish: stop" in answer
    # What a user sees: the answer's text on the page, the reasoning hidden until unfolded.
    text = browser.eval("document.querySelector('.msg.assistant').innerText")
    assert "Hi! I am scripted." in text and "The user greets me." not in text

    shot = tmp_path / "page.png"
    browser.screenshot(shot)
    assert shot.stat().st_size > 5000
    assert png_pixels_vary(shot)
    keep = os.environ.get("MOESERVE_SCREENSHOT_DIR")
    if keep:
        shutil.copy(shot, os.path.join(keep, "chat-page.png"))


def test_stop_button_cancels_the_request(browser, page_server):
    before = page_server.metrics()['moeserve_requests_total{outcome="cancelled"}']
    browser.open(page_server.url + "/#ask=Count&stop")
    assert browser.wait_state({"done", "error", "stopped"}) == "stopped"
    answer = browser.eval("document.querySelector('.msg.assistant').innerText")
    # Stop is pressed when the first words arrive: some of the count is shown (how much depends on how fast the
    # page reacts), never the whole scripted answer.
    assert "stopped" in answer and "1" in answer and "9 10 1 2 3 4 5 6 7 8 9 10" not in answer[-200:]
    deadline = time.time() + 10
    while time.time() < deadline:
        m = page_server.metrics()
        if m['moeserve_requests_total{outcome="cancelled"}'] == before + 1 and m["moeserve_num_requests_active"] == 0:
            break
        time.sleep(0.05)
    assert m['moeserve_requests_total{outcome="cancelled"}'] == before + 1
