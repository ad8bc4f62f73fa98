"""Bounded load test of `specexport serve` (a benchmark, not a test): N requests from C concurrent clients.

    python scripts/load_test.py bundles/smollm2 --requests 200 --concurrency 16 --max-tokens 128

1. Solo: each distinct prompt (first turns of Spec-Bench questions round-robin over its categories, those
   that fit the bundle's capacity, chat template) generated alone with
   `Pipeline.generate`, greedy, in this process: the reference text, and a sequential tokens/s baseline.
2. Load: `specexport serve BUNDLE` on a free loopback port as a subprocess; C client threads (the
   official openai client, streaming with include_usage) take the N requests from one queue.
3. Checks that every request completed and that each greedy text equals its solo text; reports throughput
   (requests/s, generated tokens/s), end-to-end latency and time to first token p50/p99, and the engine's
   counters from /health. One JSON record per run to --out (append), a markdown row on stdout.
`--url URL --model NAME` drives a server that is already running instead (ours on Ray, or a peer's
OpenAI-compatible server: llama.cpp's, OpenVINO Model Server); `--no-check` skips the solo pass.
The clients share the machine with the server: on 2 cores their own CPU time is part of what is measured.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

QUESTIONS = Path(__file__).resolve().parents[1].parent / "shared" / "specbench" / "question.jsonl"


@dataclass(frozen=True)
class LoadConfig:
    bundle: str
    questions: str = str(QUESTIONS)
    requests: int = 200
    distinct: int | None = None  # distinct prompts, cycled to `requests` (None: up to `requests`)
    concurrency: int = 16
    max_tokens: int = 128
    max_batch: int | None = None  # server's --max-batch (None: the bundle's largest batch)
    max_queue: int | None = None  # server's --max-queue (None: every request may wait, so none is refused)
    draft: str | None = None  # the requests' draft (None: the server's default)
    threads: int | None = None
    url: str = ""  # an already running server instead of launching one
    model: str = ""
    check: bool = True
    out: str = ""


def prompts(cfg: LoadConfig, pipe) -> tuple[list[list[dict]], int]:
    """First turns taken round-robin over Spec-Bench's categories, those that fit the bundle with max_tokens
    new tokens, cycled to cfg.requests requests -> (requests, prompts skipped as too long)."""
    by_cat: dict[str, list[str]] = {}
    with open(cfg.questions) as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                by_cat.setdefault(q["category"], []).append(q["turns"][0])
    mixed = [t for group in itertools.zip_longest(*by_cat.values()) for t in group if t is not None]
    room = pipe.manifest.capacity - cfg.max_tokens
    chosen, skipped = [], 0
    for t in mixed:
        m = [{"role": "user", "content": t}]
        if len(pipe.encode(m)) <= room:
            chosen.append(m)
        else:
            skipped += 1
        if len(chosen) == (cfg.distinct or cfg.requests):
            break
    return [chosen[i % len(chosen)] for i in range(cfg.requests)], skipped


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def solo(cfg: LoadConfig, pipe, reqs: list[list[dict]]) -> tuple[dict, dict]:
    """{prompt text: greedy text}, each distinct prompt generated alone, and that sequential baseline."""
    want, tokens, t0 = {}, 0, time.perf_counter()
    for m in reqs:
        key = m[0]["content"]
        if key not in want:
            g = pipe.generate(m, max_new_tokens=cfg.max_tokens, temperature=0)
            want[key] = g.text
            tokens += g.stats.new_tokens
    wall = time.perf_counter() - t0
    return want, {"prompts": len(want), "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def launch(cfg: LoadConfig) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "specexport.cli", "serve", cfg.bundle, "--port", str(port),
           "--max-queue", str(cfg.max_queue if cfg.max_queue is not None else cfg.requests)]
    cmd += ["--max-batch", str(cfg.max_batch)] if cfg.max_batch else []
    cmd += ["--threads", str(cfg.threads)] if cfg.threads else []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    while health(url) is None:
        if proc.poll() is not None or time.perf_counter() - t0 > 300:
            raise RuntimeError(f"the server did not come up: {' '.join(cmd)}")
        time.sleep(0.2)
    return proc, url


def health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def drive(cfg: LoadConfig, url: str, model: str, reqs: list[list[dict]]) -> tuple[list[dict], float]:
    """C threads, one shared queue of requests -> one record per request, and the wall time."""
    import openai

    todo: queue.Queue = queue.Queue()
    for i, m in enumerate(reqs):
        todo.put((i, m))
    records: list[dict] = []
    extra = {"draft": cfg.draft} if cfg.draft else {}

    def client_thread():
        c = openai.OpenAI(base_url=url + "/v1", api_key=os.environ.get("SPECEXPORT_API_KEY", "none"),
                          max_retries=0, timeout=600)
        while True:
            try:
                i, m = todo.get_nowait()
            except queue.Empty:
                return
            rec = {"i": i, "prompt": m[0]["content"], "text": "", "error": None}
            t0 = time.perf_counter()
            try:
                for ch in c.chat.completions.create(model=model, messages=m, max_tokens=cfg.max_tokens, temperature=0,
                                                    stream=True, stream_options={"include_usage": True},
                                                    extra_body=extra):
                    if ch.choices and ch.choices[0].delta.content:
                        rec.setdefault("ttft_s", time.perf_counter() - t0)
                        rec["text"] += ch.choices[0].delta.content
                    if ch.choices and ch.choices[0].finish_reason:
                        rec["finish_reason"] = ch.choices[0].finish_reason
                    if ch.usage:
                        rec["completion_tokens"] = ch.usage.completion_tokens
            except Exception as e:  # noqa: BLE001 -- counted and reported, the run goes on
                rec["error"] = repr(e)
            rec["latency_s"] = time.perf_counter() - t0
            records.append(rec)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_thread) for _ in range(cfg.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(records, key=lambda r: r["i"]), time.perf_counter() - t0


def run(cfg: LoadConfig) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import specexport

    pipe = specexport.load(cfg.bundle, threads=cfg.threads)
    reqs, skipped = prompts(cfg, pipe)
    want, base = solo(cfg, pipe, reqs) if cfg.check else ({}, None)
    del pipe  # its threads and memory are not the server's
    proc, url = (None, cfg.url) if cfg.url else launch(cfg)
    try:
        model = cfg.model or (health(url) or {}).get("model") or Path(cfg.bundle).resolve().name
        records, wall = drive(cfg, url, model, reqs)
        engine = (health(url) or {}).get("engine")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    ok = [r for r in records if r["error"] is None and "finish_reason" in r]
    tokens = sum(r.get("completion_tokens", 0) for r in ok)
    lat, ttft = [r["latency_s"] for r in ok], [r["ttft_s"] for r in ok if "ttft_s" in r]
    mismatched = [r["i"] for r in ok if cfg.check and r["text"] != want[r["prompt"]]]
    return {
        "date": time.strftime("%Y-%m-%d"), "config": asdict(cfg), "requests": len(records), "completed": len(ok),
        "distinct_prompts": len({r["prompt"] for r in records}), "prompts_too_long": skipped,
        "errors": sorted({r["error"] for r in records if r["error"]}), "mismatched": mismatched,
        "wall_s": wall, "requests_per_s": len(ok) / wall, "tokens": tokens, "tokens_per_s": tokens / wall,
        "latency_p50_s": percentile(lat, 50), "latency_p99_s": percentile(lat, 99),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99), "solo": base, "engine": engine,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--questions", default=str(QUESTIONS))
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--distinct", type=int, default=None,
                   help="distinct prompts, cycled to --requests (default: up to --requests; fewer makes the solo "
                        "reference pass shorter)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--max-queue", type=int, default=None)
    p.add_argument("--draft", choices=["ngram", "recycle", "none"], default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--url", default="", help="drive this running server instead of launching one")
    p.add_argument("--model", default="", help="the model id to send (default: what /health says)")
    p.add_argument("--no-check", action="store_true", help="skip the solo pass and the output comparison")
    p.add_argument("--out", default="", help="append the JSON record to this file")
    a = p.parse_args(argv)
    cfg = LoadConfig(bundle=a.bundle, questions=a.questions, requests=a.requests, distinct=a.distinct,
                     concurrency=a.concurrency,
                     max_tokens=a.max_tokens, max_batch=a.max_batch, max_queue=a.max_queue, draft=a.draft,
                     threads=a.threads, url=a.url, model=a.model, check=not a.no_check, out=a.out)
    rec = run(cfg)
    if cfg.out:
        with open(cfg.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
    solo_tps = f"{rec['solo']['tokens_per_s']:.1f}" if rec["solo"] else "-"
    print("| requests | concurrency | completed | = solo | tok/s | solo tok/s | req/s | p50 s | p99 s | "
          "TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    same = "-" if not cfg.check else f"{rec['completed'] - len(rec['mismatched'])}/{rec['completed']}"
    print(f"| {rec['requests']} | {cfg.concurrency} | {rec['completed']} | {same} | {rec['tokens_per_s']:.1f} | "
          f"{solo_tps} | {rec['requests_per_s']:.2f} | {rec['latency_p50_s']:.2f} | {rec['latency_p99_s']:.2f} | "
          f"{rec['ttft_p50_s']:.2f} | {rec['ttft_p99_s']:.2f} |")
    if rec["errors"] or rec["mismatched"]:
        print(f"errors: {rec['errors']}\nmismatched requests: {rec['mismatched']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
