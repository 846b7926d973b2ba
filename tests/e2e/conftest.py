"""Starts `moeserve` servers for the end-to-end tests and hands out clients."""
import json
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
        # Log lines (model loading, KV sizing) may come first; the address line ends the start.
        head = []
        m = None
        while m is None and len(head) < 100:
            line = self.proc.stdout.readline()
            if not line:
                break
            head.append(line)
            m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {''.join(head)!r}")
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


# The two servers every API test runs against: the model-free echo backend (answers repeat the prompt, one
# byte is one token) and `moeserve serve` on the built-in model (the small trained GLM-5-architecture model of
# models/builtin, or the random one generated in code: tests on it check structure, determinism and
# accounting, not words).
SERVERS = {
    "echo": (
        "echo",
        ["echo-server", "--step-time-us", "300", "--reasoning-parser", "glm45", "--max-body-bytes", "1000000"],
    ),
    "builtin": (
        "builtin",
        # KV pool sized by --mem-fraction-static (the default), capped at 64 requests x 1024 tokens.
        # --expert-stats: the /metrics histograms on the GPU as well (always on for the CPU).
        # --generation-config none: the API's own sampling defaults (the trained model's generation_config.json
        # adds a repetition penalty that would move greedy picks away from the top logprob).
        ["serve", "--context-length", "1024", "--max-running-requests", "64", "--reasoning-parser", "glm45",
         "--max-body-bytes", "1000000", "--expert-stats", "--generation-config", "none"],
    ),
}


def builtin_moe_layers():
    """MoE layers of the model `serve` runs without --model: the trained one in models/builtin (or the directory
    $MOESERVE_BUILTIN_MODEL names), else the random built-in model generated in code, which has 2."""
    env = os.environ.get("MOESERVE_BUILTIN_MODEL", "")
    if env == "random":
        return 2
    path = os.path.join(env or "models/builtin", "config.json")
    if not os.path.exists(path):
        return 2
    with open(path) as f:
        cfg = json.load(f)
    if "mlp_layer_types" in cfg:
        return sum(1 for t in cfg["mlp_layer_types"] if t == "sparse")
    return cfg["num_hidden_layers"] - cfg.get("first_k_dense_replace", 0)


def start_server(kind, *extra):
    model, args = SERVERS[kind]
    s = Server(*args, *extra)
    s.kind = kind
    s.model = model
    return s


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request):
    s = start_server(request.param)
    yield s
    s.stop()

