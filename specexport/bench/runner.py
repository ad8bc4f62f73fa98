"""The per-question mode: every method on every question in turn (interleaved, so machine drift hits all
alike), after one warm-up call each; a streaming-read bandwidth probe per question; with --repeats, each
(question, method) runs that many times in a row from the same state and the median is kept."""
from __future__ import annotations

import copy
import hashlib
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from . import machine
from .config import BenchConfig, find_questions, questions
from .peers import Methods, family, missing


def read_bandwidth(threads: int, mib: int = 512, runs: int = 5, a: np.ndarray | None = None) -> float:
    """GB/s of a streaming read (numpy sum) with `threads` threads, median of `runs`."""
    a = np.ones(mib * (1 << 20) // 8) if a is None else a
    parts = np.array_split(a, threads)
    out = []
    for _ in range(runs):
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        out.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(out)


def sha1(tokens) -> str:
    """A short fingerprint of an output, to compare outputs across runs (records keep no tokens)."""
    return hashlib.sha1(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:12]


def spread(xs: list[float]) -> float:
    """(max - min) / median of repeated timings: 0.0 for a single run."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 and statistics.median(xs) > 0 else 0.0


def runnable(cfg: BenchConfig, log: Callable[[str], None]) -> tuple:
    """The methods that can run here; one line for each one skipped, saying how to install it."""
    keep = []
    for m in cfg.methods:
        why = missing(m, cfg)
        if why:
            log(f"skipping {m}: {why}")
        else:
            keep.append(m)
    if not keep:
        raise ValueError("none of the methods can run here (see the lines above)")
    return tuple(keep)


def warm_up(m: Methods, meths: list, ids: list[int], log: Callable[[str], None]) -> list:
    """Run every method once on `ids` (loading models, first-run allocations) -> the methods that ran; a peer
    that fails to load or run is skipped with one line, a specexport method's failure is raised."""
    ran = []
    for meth in meths:
        try:
            m.run(meth, ids)
            ran.append(meth)
        except (ImportError, OSError, RuntimeError) as e:
            if family(meth) == "se":
                raise
            log(f"skipping {meth}: it failed to load or run ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
    if not ran:
        raise ValueError("none of the methods ran (see the lines above)")
    return ran


def run(cfg: BenchConfig, log=print) -> tuple[list[dict], dict]:
    """-> (records, run info: methods run, skipped, machine, versions, what each peer ran with)."""
    qpath = find_questions(cfg.questions)
    meths = list(runnable(cfg, log))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    m = Methods(cfg)
    qs = questions(qpath, cfg.per_category, cfg.limit)
    cpu = machine.cpu()
    log(f"{len(qs)} questions x {len(meths)} methods, {cfg.max_new_tokens} new tokens, reference {meths[0]}; "
        f"{machine.label()}")
    meths = warm_up(m, meths, m.pipe.encode(qs[0]["turns"][0], chat=True)[:64], log)
    m.reset()
    records = []
    probe = np.ones((512 << 20) // 8)  # the bandwidth probe's array, read once per question (drift hits it too)
    with open(out / "records.jsonl", "w") as f:
        for i, q in enumerate(qs):
            bw = read_bandwidth(cfg.threads, runs=3, a=probe)
            ids = m.pipe.encode(q["turns"][0], chat=True)
            first, refs = None, {}  # refs: bundle tag -> (method, tokens) of the first se- method on that bundle
            for meth in meths:
                toks, dt, st, runs = _sample(m, meth, ids, cfg.repeats)
                first = first or (meth, toks)  # the reference of peers and of another bundle's first method
                tag = meth.partition("@")[2] if meth.startswith("se-") else None
                # sampled: only specexport methods share a random stream (Gumbel noise per position), so only
                # they are compared, each with the first specexport method on its bundle
                ref = (refs.get(tag) if tag is not None else None) if cfg.temperature else refs.get(tag, first)
                if tag is not None:
                    refs.setdefault(tag, (meth, toks))
                r = {"question_id": q["question_id"], "category": q["category"], "method": meth,
                     "prompt_tokens": len(ids), "new_tokens": len(toks), "seconds": dt,
                     "tokens_per_s": len(toks) / dt, "identical": None if ref is None else toks == ref[1],
                     "reference": ref and ref[0], "output_sha1": sha1(toks), "bandwidth_gbs": bw,
                     **({"seconds_runs": runs, "spread": spread(runs)} if len(runs) > 1 else {}),
                     **{k: st[k] for k in ("tau", "acceptance", "hist", "steps", "draft_s", "verify_s",
                                           "host_s", "prefill_s", "repeats_identical") if k in st},
                     "cpu": cpu["model"], "cpu_flags": " ".join(cpu["flags"])}
                records.append(r)
                f.write(json.dumps(r) + "\n")
            row = records[-len(meths):]
            noisy = [r["method"] for r in row if r.get("spread", 0) > cfg.noise]
            log(f"[{i + 1}/{len(qs)}] {q['category']:15s} " + " ".join(
                f"{r['method']}={r['tokens_per_s']:.1f}" for r in row) +
                (f"  (noisy: {', '.join(noisy)} spread > {cfg.noise:.0%})" if noisy else ""))
    info = {"methods": meths, "skipped": [x for x in cfg.methods if x not in meths], "questions": str(qpath),
            "machine": cpu, "versions": machine.versions(), "peers": m.info}
    return records, info


def _sample(m: Methods, meth: str, ids: list[int], repeats: int):
    """Run `meth` `repeats` times from the same state -> (tokens, median seconds, stats of that run, seconds
    of every run). Repeats of a recycle method start from the successor table it had before the first."""
    state = m.snapshot(meth) if repeats > 1 else None
    runs, after, first = [], None, None
    for r in range(repeats):
        if r:
            m.restore(meth, copy.deepcopy(state))
        toks, dt, st = m.run(meth, ids)
        if r == 0:
            first, after = toks, (m.snapshot(meth) if repeats > 1 else None)
        elif toks != first:
            st = {**st, "repeats_identical": False}  # a peer that is not deterministic: kept, and flagged
        runs.append((dt, st))
    if repeats > 1:
        m.restore(meth, after)
    secs = [dt for dt, _ in runs]
    med = statistics.median(secs)
    st = min(runs, key=lambda x: abs(x[0] - med))[1]
    return first, med, st, secs
