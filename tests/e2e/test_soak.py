"""Soak: `moeserve bench` at concurrency 32 for a bounded time against a server; no request may fail, every KV
page a request held must be free at the end, and resident memory must stay within 10% of its value after a
warm-up run."""
import json
import os
import subprocess

import pytest

from conftest import Server

SOAK_SECONDS = float(os.environ.get("MOESERVE_SOAK_SECONDS", "8"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def bench(server, out, concurrency, duration, prompts, input_len=256, output_len=64):
    binary = os.environ.get("MOESERVE_BIN", "build/moeserve")
    subprocess.run(
        [binary, "bench", "--base-url", server.url, "--num-prompts", str(prompts), "--input-len", str(input_len),
         "--output-len", str(output_len), "--range-ratio", "0.5", "--max-concurrency", str(concurrency), "--duration",
         str(duration), "--disable-progress", "--output-json", out],
        check=False, capture_output=True, timeout=duration + 120,
    )
    with open(out) as f:
        return json.load(f)["results"][0]


# A pool of 40 HTTP threads: each thread's stack becomes resident the first time it serves a request, so a pool
# of hundreds would read as growth over a short run though nothing leaks.
SOAK_SERVERS = {
    "echo": ["echo-server", "--step-time-us", "1000", "--num-pages", "512", "--max-running-requests", "32",
             "--http-threads", "40"],
    # The built-in model on the CPU; a pool of 512 pages of 64 tokens (zeroed, so resident, at start).
    "builtin": ["serve", "--kv-cache-tokens", "32768", "--max-running-requests", "32", "--max-prefill-tokens",
                "2048", "--http-threads", "40"],
}


# Allocations above 128 KiB (a step's activations) go to mmap and back to the system when freed, instead of
# the heap's top, so resident memory between runs is live memory rather than where glibc's adaptive threshold
# happened to leave the heap.
SOAK_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


@pytest.mark.parametrize("kind", list(SOAK_SERVERS))
def test_soak(tmp_path, kind):
    s = Server(*SOAK_SERVERS[kind], env=SOAK_ENV)
    # The model computes on the CPU: shorter requests keep the requests in flight when the time is up (which
    # the bench waits for) short on a loaded machine.
    lens = (256, 64) if kind == "echo" else (128, 32)
    try:
        # Warm-up until the prefix cache (where there is one) has filled the pool and the heap has its working
        # set.
        for i in range(2):
            warm = bench(s, str(tmp_path / f"warm{i}.json"), 32, 3, 100000, *lens)
            assert warm["failed"] == 0, warm["errors"]
        rss_warm = rss_kib(s.proc.pid)
        r = bench(s, str(tmp_path / "soak.json"), 32, SOAK_SECONDS, 100000, *lens)
        assert r["failed"] == 0, r["errors"]
        assert r["completed"] > 32
        m = s.metrics()
        assert m["moeserve_num_requests_active"] == 0
        assert m["moeserve_kv_pages_used"] == m["moeserve_kv_pages_cached"], m  # nothing but the prefix cache
        rss_end = rss_kib(s.proc.pid)
        assert rss_end <= rss_warm * 1.10, (rss_warm, rss_end)
    finally:
        assert s.stop() == 0
