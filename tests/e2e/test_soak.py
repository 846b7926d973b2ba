"""Soak: `moeserve bench` at concurrency 32 for a bounded time against a server; no request may fail, every KV
page a request held must be free at the end, and resident memory must stay within 10% of its value after a
warm-up run."""
import json
import os
import subprocess

from conftest import Server

SOAK_SECONDS = float(os.environ.get("MOESERVE_SOAK_SECONDS", "8"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def bench(server, out, concurrency, duration, prompts):
    binary = os.environ.get("MOESERVE_BIN", "build/moeserve")
    subprocess.run(
        [binary, "bench", "--base-url", server.url, "--num-prompts", str(prompts), "--input-len", "256",
         "--output-len", "64", "--range-ratio", "0.5", "--max-concurrency", str(concurrency), "--duration",
         str(duration), "--disable-progress", "--output-json", out],
        check=False, capture_output=True, timeout=duration + 120,
    )
    with open(out) as f:
        return json.load(f)["results"][0]


def test_soak_echo_server(tmp_path):
    # A pool of 40 HTTP threads: each thread's stack becomes resident the first time it serves a request, so a
    # pool of hundreds would read as growth over a short run though nothing leaks.
    s = Server(
        "echo-server", "--step-time-us", "1000", "--num-pages", "512", "--max-running-requests", "32",
        "--http-threads", "40",
    )
    try:
        # Warm-up until the prefix cache has filled the pool and the heap has its working set.
        for i in range(2):
            warm = bench(s, str(tmp_path / f"warm{i}.json"), 32, 3, 100000)
            assert warm["failed"] == 0, warm["errors"]
        rss_warm = rss_kib(s.proc.pid)
        r = bench(s, str(tmp_path / "soak.json"), 32, SOAK_SECONDS, 100000)
        assert r["failed"] == 0, r["errors"]
        assert r["completed"] > 32
        m = s.metrics()
        assert m["moeserve_num_requests_active"] == 0
        assert m["moeserve_kv_pages_used"] == m["moeserve_kv_pages_cached"], m  # nothing but the prefix cache
        rss_end = rss_kib(s.proc.pid)
        assert rss_end <= rss_warm * 1.10, (rss_warm, rss_end)
    finally:
        assert s.stop() == 0
