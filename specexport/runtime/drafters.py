"""Drafters: who proposes the next k tokens. A drafter never decides what is emitted; the target does.

- ModelDrafter: a draft model of the bundle (separate checkpoint, early-exit slice, int4/int8 copy),
  with its own KV ring buffer; it catches up on the tokens it has not seen, then proposes k. A self-draft
  with the target's KV layout (an int4/int8 copy) reads the target's cache instead (SharedKV): no prefill
  and no cache of its own.
- NgramDrafter: prompt lookup, no model: the continuation of the latest earlier occurrence of the
  context's last n tokens.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .backends import Backend, OrtBackend
from .kv import RingKV

# choose(logits_row [V], position) -> (token, q_row [V] or None)
Choose = Callable[[np.ndarray, int], tuple[int, np.ndarray | None]]


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


class SharedKV(RingKV):
    """A self-draft's view of the target's cache (same layers, heads and buckets): it reads the target's
    committed slots and writes its own proposals into the free slots after them, which the target's next
    call overwrites. It never moves the target's committed length; `n` here is the draft's own."""

    def __init__(self, target: RingKV):
        self.target, self.n, self.scratch, self.buckets = target, target.n, {}, target.buckets

    data = property(lambda self: self.target.data)
    S = property(lambda self: self.target.S)
    _slot = property(lambda self: self.target._slot)

    def reserve(self, n: int) -> None:
        self.target.reserve(n)


def shares_cache(target: Backend, draft: Backend) -> bool:
    """Can `draft` read `target`'s cache: a self-draft (int4/int8 copy) with the same cache shape, both on
    numpy caches (onnxruntime CPU)."""
    return (draft.entry.kind in ("int4", "int8") and isinstance(target, OrtBackend)
            and isinstance(draft, OrtBackend) and draft.shape == target.shape)


class ModelDrafter:
    def __init__(self, model: Backend, share: bool = False):
        self.model, self.share = model, share
        self.cache: RingKV | None = None
        self.run_s = 0.0

    def start(self, prompt: list[int], target_cache: RingKV | None = None) -> None:
        if self.share and target_cache is not None:  # the target's prefill serves both
            self.cache, self.run_s = SharedKV(target_cache), 0.0
            return
        self.cache = self.model.new_cache()
        _, s = feed(self.model, self.cache, prompt[:-1])
        self.run_s = s

    def propose(self, tokens: list[int], k: int, choose: Choose) -> tuple[list[int], list]:
        N = len(tokens)
        if isinstance(self.cache, SharedKV):
            self.cache.n = self.cache.target.n  # the target's committed tokens: all but the last
        logits, s = feed(self.model, self.cache, tokens[self.cache.n:])  # catch up: usually 1 or 2 tokens
        props, qs = [], []
        for i in range(k):
            d, q = choose(logits, N + i)
            props.append(d)
            qs.append(q)
            if i + 1 < k:
                out = self.model.step(self.cache, [d], self.cache.n)
                self.cache.commit(out.new_kv, [0])
                logits, s = out.logits[0], s + out.run_s
        self.run_s += s
        return props, qs

    def accepted(self, n_before: int, a: int, k: int) -> None:
        """Keep the draft's K/V whose inputs were committed: positions < n_before + min(a, k-1) (a shared
        cache starts from the target's at each proposal instead)."""
        self.cache.truncate(min(self.cache.n, n_before + min(a, k - 1)))


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_n .. 1) and propose
    what followed it."""

    run_s = 0.0

    def __init__(self, max_n: int = 3):
        if max_n < 1:
            raise ValueError("ngram size must be >= 1")
        self.max_n = max_n

    def start(self, prompt: list[int], target_cache: RingKV | None = None) -> None:
        pass

    def propose(self, tokens: list[int], k: int, choose: Choose) -> tuple[list[int], list]:
        arr = np.asarray(tokens)
        L = len(arr)
        # earlier positions e <= L-2 holding the last token, narrowed while the n-1 tokens before them match
        # too: the latest of the longest match; one pass over the sequence per step (it runs every step)
        ends = np.flatnonzero(arr[:L - 1] == arr[-1])
        if not len(ends):
            return [], []
        for n in range(2, min(self.max_n, L - 1) + 1):
            longer = ends[ends >= n - 1]
            longer = longer[arr[longer - (n - 1)] == arr[L - n]]
            if not len(longer):
                break
            ends = longer
        props = arr[ends[-1] + 1:ends[-1] + 1 + k].tolist()
        return props, [None] * len(props)

    def accepted(self, n_before: int, a: int, k: int) -> None:
        pass

