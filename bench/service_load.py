"""`/v1/health` while the service is flooded with plan searches: a real `moment serve` process,
N concurrent `POST /v1/plan` (paper-machine-b, 4 GPUs + 8 SSDs), and one health probe every 0.1 s
from a process of its own (so the flood's client threads do not slow the probe), timed from start to
answer. Prints `name: value` lines: health latency (median, max), the plans' status codes and how long
the slowest took to get its answer. `--root` serves another checkout (e.g. an older commit extracted
with `git archive`) to compare on the same machine.

    .venv/bin/python bench/service_load.py [--plans 60] [--plan-timeout 120] [--root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = {"profile": "paper-machine-b", "gpus": 4, "ssds": 8}


def call(url: str, body: dict | None = None, timeout: float = 600) -> int:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


#: the health prober: GET every 0.1 s until stdin says stop, then print each latency
PROBE = """
import sys, threading, time, urllib.request
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
out = []
while not stop.is_set():
    t = time.monotonic()
    urllib.request.urlopen(sys.argv[1], timeout=600).read()
    out.append(time.monotonic() - t)
    time.sleep(0.1)
print(" ".join(f"{x:.4f}" for x in out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plans", type=int, default=60)
    ap.add_argument("--plan-timeout", type=float, default=120)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose `moment` serves")
    args = ap.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(args.root.resolve())}
    env.pop("MOMENT_TOKEN", None)
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen([sys.executable, "-m", "moment", "serve", "--port", str(port), "--data-dir", d,
                                 "--plan-timeout", str(args.plan_timeout), "--log-level", "warning"],
                                env=env, cwd=args.root, stderr=subprocess.DEVNULL)
        try:
            end = time.monotonic() + 60
            while True:
                try:
                    call(base + "/v1/health", timeout=2)
                    break
                except (urllib.error.URLError, ConnectionError):
                    if time.monotonic() > end or proc.poll() is not None:
                        raise SystemExit("the server did not start") from None
                    time.sleep(0.2)
            call(base + "/v1/plan", PLAN)  # warm: imports and the profile cache

            codes: list[int] = []
            plan_s: list[float] = []

            def plan() -> None:
                t = time.monotonic()
                codes.append(call(base + "/v1/plan", PLAN))
                plan_s.append(time.monotonic() - t)

            prober = subprocess.Popen([sys.executable, "-c", PROBE, base + "/v1/health"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            threads = [threading.Thread(target=plan) for _ in range(args.plans)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            total = time.monotonic() - t0
            out, _ = prober.communicate("stop\n", timeout=600)
            health_s = [float(x) for x in out.split()]
        finally:
            proc.terminate()
            proc.wait(30)
    print(f"concurrent_plans: {args.plans}")
    print(f"plan_status_codes: {dict(sorted(Counter(codes).items()))}")
    print(f"plan_slowest_answer_s: {max(plan_s):.2f}")
    print(f"plans_all_answered_s: {total:.2f}")
    print(f"health_probes: {len(health_s)}")
    print(f"health_median_s: {statistics.median(health_s):.3f}")
    print(f"health_max_s: {max(health_s):.3f}")
    print(f"health_slowest_5_s: {[round(x, 2) for x in sorted(health_s)[-5:]]}")


if __name__ == "__main__":
    main()
