"""Measure issue 50's F-1/F-2 on a real `relsearch serve`: one client's heavy batch against another's light searches.

Three long documents (390k words each) are added to a copy of a small index; client A sends one
/search/batch of 256 × the same three-word query, with highlight, hybrid rrf, filtered to those
documents; meanwhile client B sends a 3-hit search of the other documents every 0.3 s. Printed: A's time, B's slowest
answer and any non-200, and the server process's CPU seconds in the 5 s after A's answer (work
left running for nobody).

    HF_HUB_OFFLINE=1 python tools/fair_share.py [--index DIR] [--words 390000] [--timeout 30]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def post(port: int, path: str, body: dict, timeout: float = 120) -> tuple[int, dict | str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode("utf-8", "replace")[:200]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", help="an index to copy (default: the first 120 demo companies, built here)")
    ap.add_argument("--words", type=int, default=390_000)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=30.0, help="the server's --timeout")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp())
    index = work / "idx"
    if args.index:
        shutil.copytree(args.index, index, symlinks=True)
    else:
        from relsearch.pipelines.index import IndexJob, run_index

        corpus = Path(__file__).resolve().parents[1] / "relsearch" / "data" / "sp500_2017.jsonl"
        (work / "c.jsonl").write_text("\n".join(corpus.read_text().splitlines()[:120]) + "\n")
        run_index(IndexJob(input=str(work / "c.jsonl"), index=str(index), progress=False))
    server = subprocess.Popen([sys.executable, "-m", "relsearch", "serve", "--index", str(index), "--port", "0",
                               "--timeout", str(args.timeout), "--max-body-bytes", str(16 << 20)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(server.stdout.readline().rsplit(":", 1)[1].split("/")[0])
        rng = random.Random(0)
        words = "gas pipeline power grid water cloud software bank loan drug trial retail store".split()
        for i in range(3):
            text = " ".join(rng.choice(words) for _ in range(args.words))
            status, _ = post(port, "/documents", {"documents": [{"id": f"long{i}", "text": text, "kind": "long"}]})
            print(f"added long{i} ({len(text):,} characters): {status}")
        heavy = {"queries": [{"text": "natural gas pipeline"}] * args.queries, "k": 3, "highlight": True,
                 "hybrid": "rrf", "filters": {"kind": "long"}}
        light_times, light_codes, done = [], [], threading.Event()

        def light_client():
            while not done.is_set():
                started = time.monotonic()
                # the corpus's own documents: a hit of 2.4 MB of text is its own client's cost, not the batch's
                status, _ = post(port, "/search", {"text": "cloud software", "k": 3, "filters": {"kind": {"exists": False}}})
                light_times.append(time.monotonic() - started)
                light_codes.append(status)
                time.sleep(0.3)

        thread = threading.Thread(target=light_client)
        started = time.monotonic()
        thread.start()
        status, _ = post(port, "/search/batch", heavy)
        heavy_s = time.monotonic() - started
        cpu = cpu_seconds(server.pid)
        time.sleep(5)
        cpu_after = cpu_seconds(server.pid) - cpu
        done.set()
        thread.join()
        print(f"heavy batch: {status} in {heavy_s:.1f} s ({args.queries} queries, {args.words:,} words per document)")
        print(f"light searches: {len(light_times)}, slowest {max(light_times):.2f} s, median "
              f"{sorted(light_times)[len(light_times) // 2]:.2f} s, non-200: {sum(c != 200 for c in light_codes)}")
        print(f"server CPU in the 5 s after the heavy answer: {cpu_after:.2f} s (light searches included)")
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
