"""Starts `moeserve` servers for the end-to-end tests and hands out clients."""
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import requests


class Server:
    def __init__(self, *args, env=None):
        binary = os.environ.get("MOESERVE_BIN", "build/moeserve")
        self.proc = subprocess.Popen(
            [binary, *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        line = self.proc.stdout.readline()
        m = re.search(r"http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.url = f"http://{m.group(1)}:{m.group(2)}"
        self.log = []
        # Keep reading its output so the server never blocks on a full pipe.
        threading.Thread(target=lambda: self.log.extend(self.proc.stdout), daemon=True).start()
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.05)

    def metrics(self):
        text = requests.get(self.url + "/metrics", timeout=5).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def echo_server():
    s = Server("echo-server", "--step-time-us", "300", "--reasoning-parser", "glm45", "--max-body-bytes", "1000000")
    yield s
    s.stop()
