"""Helpers of the replays that price drafting policies on the target's greedy output (lookup_first.py,
draft_then_table.py, draft_agreement.py): that output, the calls they are priced with, and a model's logits
teacher-forced."""
import statistics
import time

import numpy as np

from specexport.bench.config import find_questions, questions
from specexport.runtime.prefill import feed


def greedy(pipe, requests: int = 16, new: int = 128) -> list:
    """The target's greedy answers to the burst's first `requests` Spec-Bench prompts (the bench's 4 per category,
    round-robin) -> [(question, ids: prompt and answer, n0: the prompt's length, out: the answer)]."""
    rows = []
    for q in questions(find_questions(None), 4)[:requests]:
        g = pipe.generate([{"role": "user", "content": q["turns"][0]}], chat=True, max_new_tokens=new, draft="none")
        rows.append((q, list(g.prompt_ids) + list(g.token_ids), len(g.prompt_ids), list(g.token_ids)))
    return rows


def call_costs(t, d, rounds: int = 12) -> tuple:
    """The target's (B, T) calls for T = 1 and every built verify T and the draft's (B, 1), B = 1 and 2, at 300 /
    320 cached tokens, interleaved `rounds` times -> (built Ts, {("t"|"d", B, T): median ms of all but the first
    two}), printed."""
    built = sorted({1} | {T for name, T in t.entry.profiles.items() if name.startswith("verify_")})
    pool, dpool = t.new_pool(2), d.new_pool(2)
    for p in (pool, dpool):
        p.reserve(1024)
        p.n[:] = [300, 320]
    shapes = [("t", B, T) for B in (1, 2) for T in built] + [("d", B, 1) for B in (1, 2)]
    ms = {s: [] for s in shapes}
    for _ in range(rounds):
        for s in shapes:
            who, B, T = s
            m, p = (t, pool) if who == "t" else (d, dpool)
            pos = p.n[:B, None].astype(np.int64) + np.arange(T)[None]
            c = time.perf_counter()
            m.step_batch(p, np.ones((B, T), np.int64), pos)
            ms[s].append(1e3 * (time.perf_counter() - c))
    cost = {s: statistics.median(v[2:]) for s, v in ms.items()}
    print("calls (ms):", ", ".join(f"{w}({B},{T}) {c:.1f}" for (w, B, T), c in cost.items()))
    return built, cost


def forced(model, ids: list, n0: int) -> np.ndarray:
    """The model's logits [len(ids) - n0, V] after each of ids[n0 - 1:-1] (its own cache prefilled with the
    prompt ids[:n0 - 1], then fed the rest in 64-token calls)."""
    cache = model.new_cache()
    cache.reserve(len(ids) + 64)
    feed(model, cache, ids[:n0 - 1])
    out = []
    for c in range(n0 - 1, len(ids) - 1, 64):
        chunk = ids[c:min(c + 64, len(ids) - 1)]
        o = model.step(cache, chunk + [0] * (64 - len(chunk)), cache.n, rows=list(range(len(chunk))))
        cache.commit(o.new_kv, range(len(chunk)))
        out.append(np.asarray(o.logits).reshape(-1, o.logits.shape[-1])[:len(chunk)])
    return np.concatenate(out)
