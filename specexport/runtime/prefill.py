"""Prefill: run a prompt through a model in chunks of its profiles, committing every row. The target, a
draft model and the engine's admitted requests all prefill this way.
"""
from __future__ import annotations

import numpy as np

from ..backends.base import Backend
from .kv import RingKV


def feed_chunk(model: Backend, cache: RingKV, ids: list[int], i: int):
    """Run the next chunk of `ids` from index i at positions cache.n.., committing its rows -> (i, r, StepOut):
    r ids were fed. A remainder is padded up to the next profile when that wastes at most half of the call,
    else split into the largest profiles that fit; pad rows are never committed. Only the chunk's last row
    gets logits (a fused graph skips the LM head of the others: ~21% of a SmolLM2 row's FLOPs)."""
    sizes = sorted(set(model.entry.profiles.values()))
    r = min(len(ids) - i, model.entry.profiles.get("prefill", sizes[-1]))
    T = next(t for t in sizes if t >= r)
    if T > 2 * r:  # padding would waste over half the call: run the largest profile that fits instead
        T = r = max(t for t in sizes if t <= r)
    out = model.step(cache, ids[i:i + r] + [0] * (T - r), cache.n, rows=[r - 1])
    cache.commit(out.new_kv, range(r))
    return i, r, out


def feed(model: Backend, cache: RingKV, ids: list[int]) -> tuple[np.ndarray, float]:
    """Run `ids` through `model` at positions cache.n.. in chunks of its profiles (feed_chunk), committing
    every row -> (logits of the last id [V], seconds inside the backend)."""
    spent, logits, i = 0.0, None, 0
    while i < len(ids):
        i, r, out = feed_chunk(model, cache, ids, i)
        logits, spent, i = out.logits[0], spent + out.run_s, i + r
    return logits, spent
