"""Judge throughput: judged captions per second against a local OpenAI-compatible stub server.

Starts ``benchmarks/openai_stub_server.py`` as its own process (fixed latency per request, valid
answers), then judges unique captions with :class:`DLCJudge` at each concurrency, then again
from the cache (in-memory front, and a fresh client on the same SQLite file)::

    sa2va-rl bench judge --latency-ms 50 --concurrency 1 16 64

Each caption has one recognition, 4 positive and 5 negative questions (DLC-Bench's typical
shape): ``batched`` mode sends 1 request per caption, ``per_question`` mode 10.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from projects.llava_sam2.rl_train.benchmarks import openai_stub_server
from projects.llava_sam2.rl_train.rewards.judge import DLCJudge, JudgeClient, QAEntry, Question

PROG = "sa2va-rl bench judge"

ASK = "Which of the following is applicable to the description?"


def bench_entry() -> QAEntry:
    """A DLC-Bench-shaped entry: 4 positive and 5 negative questions, all different prompts."""
    positives = tuple(
        Question(ASK, ((f"The color of part {i} is mentioned and is red.", 1.0),
                       (f"The color of part {i} is not mentioned, but part {i} is.", 0.5),
                       (f"Part {i} is not mentioned.", 0.0),
                       (f"The color of part {i} is mentioned but is not red.", -1.0)), "positive")
        for i in range(4))
    negatives = tuple(
        Question(ASK, ((f"Thing {i} is not mentioned in the description.", 1.0),
                       (f"Thing {i} is mentioned in the description.", -1.0)), "negative", "salient negative")
        for i in range(5))
    return QAEntry("car", positives + negatives)


def start_server(latency_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", openai_stub_server.__name__, "--latency-ms", str(latency_ms)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"stub server did not start: {line!r}")
    return proc, line.split()[1]


async def judge_all(judge: DLCJudge, captions: list[str], entry: QAEntry) -> float:
    """Seconds to judge every caption at once (the client's semaphore bounds concurrency)."""
    start = time.perf_counter()
    results = await asyncio.gather(*(judge.judge(c, entry) for c in captions), return_exceptions=True)
    elapsed = time.perf_counter() - start
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(captions)} captions failed, first: {errors[0]!r}")
    return elapsed


def run_level(base_url: str, concurrency: int, mode: str, n_captions: int, cache_path: str | None) -> dict:
    client = JudgeClient(dict(base_url=base_url, max_concurrency=concurrency, max_retries=0,
                              timeout_s=30, cache_path=cache_path))
    judge = DLCJudge(client, mode)
    entry = bench_entry()
    captions = [f"A red car number {i} parked at level {concurrency} in {mode} mode." for i in range(n_captions)]

    async def both() -> tuple[float, float, float]:
        cpu_start = time.process_time()
        cold = await judge_all(judge, captions, entry)
        cpu = time.process_time() - cpu_start  # this process only: the server runs elsewhere
        warm = await judge_all(judge, captions, entry)  # every request is now a cache hit
        await client.aclose()
        return cold, warm, cpu

    cold, warm, cpu = asyncio.run(both())
    requests = client.counters["requests"]
    row = {"mode": mode, "concurrency": concurrency, "captions": n_captions, "requests": requests,
           "captions_per_s": n_captions / cold, "requests_per_s": requests / cold,
           "client_cpu_ms_per_request": 1000 * cpu / requests, "cached_captions_per_s": n_captions / warm}
    if cache_path is not None:  # a new process would start here: fresh client, same SQLite file
        disk = DLCJudge(JudgeClient(dict(base_url=base_url, cache_path=cache_path)), mode)
        row["sqlite_cached_captions_per_s"] = n_captions / asyncio.run(judge_all(disk, captions, entry))
        disk.client.cache.close()
        if disk.client.counters["requests"]:
            raise RuntimeError("the SQLite cache missed; every caption should have been cached")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0, help="server latency per request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--modes", nargs="+", default=["batched", "per_question"], choices=["batched", "per_question"])
    parser.add_argument("--seconds", type=float, default=2.0, help="target duration per level (sets the caption count)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    proc, base_url = start_server(args.latency_ms)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for mode in args.modes:
                per_caption = 1 if mode == "batched" else 10
                for c in args.concurrency:
                    # enough captions for ~--seconds at ideal scaling (c requests per latency)
                    ideal = c / (args.latency_ms / 1000.0) / per_caption
                    n = int(min(max(ideal * args.seconds, 20), 4096))
                    rows.append(run_level(base_url, c, mode, n, os.path.join(tmp, f"{mode}-{c}.sqlite")))
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.stdin.close()
        proc.wait(10)
    load = os.getloadavg()[0]
    print(f"\nlatency {args.latency_ms:g} ms/request, {os.cpu_count()} CPU cores (load average {load:.1f}), "
          "client and server in separate processes")
    print("| mode | concurrency | captions | captions/s | requests/s | client CPU ms/request "
          "| cached captions/s (memory) | cached (SQLite, new client) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['concurrency']} | {r['captions']} | {r['captions_per_s']:.1f} | "
              f"{r['requests_per_s']:.1f} | {r['client_cpu_ms_per_request']:.2f} | {r['cached_captions_per_s']:.0f} | "
              f"{r.get('sqlite_cached_captions_per_s', float('nan')):.0f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
