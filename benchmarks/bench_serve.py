"""streetlamp serve under load: latency of the live explain view (attention recording + occlusion) for a
32-token text on minilm-sentiment, p50/p95 with 1 and with 8 concurrent clients, failed requests, and the
server's resident memory after 10 requests against after N (default 1,000). The defaults are the issue's
measurement (60 s per concurrency level, 1 and 8 clients, 1,000 requests); the flags shorten it. The load
average is printed beside every figure (the machine may be shared).

The server is the real command (`streetlamp serve`, a subprocess: its RSS is read with psutil); the
clients are threads posting to /api/explain with the access token the command prints.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_serve.py                 # the issue's 60 s, 1 and 8, 1,000
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_serve.py --duration 20 --requests 300
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import text_of_length  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def start(model: str, port: int, queue: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streetlamp.cli",
            "serve",
            "--model",
            model,
            "--port",
            str(port),
            "--queue",
            str(queue),
            "--runs",
            str(ROOT / "runs" / "bench-serve"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    for line in p.stdout:
        m = re.search(r"\?token=(\S+)", line)
        if m:  # keep reading what the server prints, or a full pipe would stop it
            threading.Thread(target=p.stdout.read, daemon=True).start()
            return p, m.group(1)
    raise SystemExit(f"streetlamp serve exited ({p.wait()}) without printing its URL")


def one(client: httpx.Client, text: str) -> tuple[float, bool]:
    t0 = time.perf_counter()
    try:
        r = client.post("/api/explain", json={"text": text, "methods": ["occlusion"]})
        ok = r.status_code == 200 and "view" in r.json()
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - t0, ok


def load(base: str, token: str, text: str, clients: int, duration: float) -> tuple[list[float], int]:
    lat: list[float] = []
    failed = [0]
    lock = threading.Lock()
    stop = time.monotonic() + duration

    def worker() -> None:
        with httpx.Client(base_url=base, headers={"x-streetlamp-token": token}, timeout=600) as c:
            while time.monotonic() < stop:
                dt, ok = one(c, text)
                with lock:
                    (lat.append(dt) if ok else failed.__setitem__(0, failed[0] + 1))

    ts = [threading.Thread(target=worker) for _ in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat, failed[0]


def loadavg() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg()) + f" ({os.cpu_count()} CPUs)"


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] if len(xs) > 1 else xs[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm-sentiment")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per concurrency level (issue: 60)")
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 8], help="concurrency levels (none: memory only)")
    ap.add_argument("--requests", type=int, default=1000, help="requests before the second memory reading")
    args = ap.parse_args()
    from streetlamp.models.loading import load as load_model

    text = text_of_length(load_model(args.model), args.tokens)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc, token = start(args.model, port, queue=max(args.clients or [1]))
    base = f"http://127.0.0.1:{port}"
    rss = psutil.Process(proc.pid)
    try:
        print(
            f"streetlamp serve {args.model}, live explain (recording + occlusion) of a {args.tokens}-token text, "
            f"torch threads per server: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; {loadavg()}"
        )
        with httpx.Client(base_url=base, headers={"x-streetlamp-token": token}, timeout=600) as c:
            done = failed_all = 0
            for _ in range(10):
                ok = one(c, text)[1]
                done, failed_all = done + ok, failed_all + (not ok)
            mem10 = rss.memory_info().rss
            print(f"after {done} requests: server RSS {mem10 / 2**20:.0f} MiB; {loadavg()}", flush=True)
            for k in args.clients:
                lat, failed = load(base, token, text, k, args.duration)
                done, failed_all = done + len(lat), failed_all + failed
                print(
                    f"{k} client(s), {args.duration:g} s: {len(lat)} requests, p50 {pct(lat, 50):.3f} s, "
                    f"p95 {pct(lat, 95):.3f} s, failed {failed}; {loadavg()}",
                    flush=True,
                )
            t0 = time.perf_counter()
            while done < args.requests:
                ok = one(c, text)[1]
                done, failed_all = done + ok, failed_all + (not ok)
            mem_n = rss.memory_info().rss
        print(
            f"server RSS after 10 requests {mem10 / 2**20:.0f} MiB, after {done} requests {mem_n / 2**20:.0f} MiB "
            f"({(mem_n - mem10) / 2**20:+.0f} MiB); top-up took {time.perf_counter() - t0:.0f} s; "
            f"failed requests in all {failed_all}; {loadavg()}"
        )
    finally:
        proc.terminate()
        proc.wait(15)


if __name__ == "__main__":
    main()
