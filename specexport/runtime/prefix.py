"""Prompt prefixes' K/V kept for later requests of the batching engine (prefix caching).

Requests to one service share their first tokens: every chat prompt starts with the chat template's system
preamble (24 tokens for SmolLM2-Instruct), a service adds its own system prompt, and the next turn of a chat
starts with the whole of the last one. The engine keeps the K/V of prompts it has prefilled (and of requests
that ended: their answers are the next turn's prompt) and a new request copies the longest cached run of its
own first tokens into its pool row, then prefills only the rest. Lossless only where a row's K/V and logits do
not depend on the call that computed them: `exact` checks that bit for bit when the engine starts, and the
engine keeps no cache where it fails (the portable graph's attention, plain ops over the bucket, rounds a
prefix copied from another call 3e-7 apart on the tiny test checkpoint; the fused graph on specexport's
kernels gives the same bits, tests/test_prefix.py).

An entry is a token sequence and its K/V [L, 2, Hkv, P, D]; a lookup takes the longest common prefix with any
entry (not only whole entries), at least MIN_HIT tokens and at most the prompt's length - 1 (the last prompt
token is always computed: its logits give the first token). Entries live within a byte budget, least recently
used out first; an entry that another extends is dropped for the longer one.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .prefill import feed

# the engine's budget by default (Pipeline.start_engine, serve and bench --prefix-cache-mb): ~5,700 tokens of SmolLM2's
# K/V in float32, ~40 Spec-Bench requests' prompts and answers; at 64 MB (~8 of them) a Poisson stream that sent each
# of 16 prompts twice found none of the second ones still cached (2026-12-06, `epyc-zen3`)
DEFAULT_MB = 256
# shorter hits are not taken: they save a few tokens of prefill, and a request with a hit leaves the batched
# first-chunk call of a burst (its rows must start at n = 0) for a call of its own
MIN_HIT = 16


class PrefixCache:
    def __init__(self, budget_bytes: int, token_bytes: int):
        self.budget, self.token_bytes = int(budget_bytes), int(token_bytes)
        self.entries: OrderedDict = OrderedDict()  # key -> (tokens int64 [P], kv [L, 2, Hkv, P, D])
        self.bytes = 0
        self.hits = self.hit_tokens = self.lookups = 0
        self._key = 0

    def lookup(self, ids: list) -> tuple[int, np.ndarray | None]:
        """The longest cached prefix of `ids` -> (P, kv of it [L, 2, Hkv, >=P, D]), or (0, None)."""
        self.lookups += 1
        ids = np.asarray(ids, dtype=np.int64)
        best, key = 0, None
        for k, (toks, _) in self.entries.items():
            m = min(len(toks), len(ids) - 1)
            if m <= best:
                continue
            same = toks[:m] == ids[:m]
            p = m if same.all() else int(np.argmin(same))
            if p > best:
                best, key = p, k
        if best < MIN_HIT:
            return 0, None
        self.entries.move_to_end(key)
        self.hits, self.hit_tokens = self.hits + 1, self.hit_tokens + best
        return best, self.entries[key][1]

    def insert(self, ids: list, kv: np.ndarray) -> None:
        """Keep the K/V [L, 2, Hkv, P, D] of tokens ids[:P] (a copy is the caller's: `kv` is kept as given)."""
        toks = np.asarray(ids[:kv.shape[3]], dtype=np.int64)
        size = kv.nbytes
        if len(toks) < MIN_HIT or size > self.budget:
            return
        for k, (t, _) in list(self.entries.items()):
            if len(t) >= len(toks) and np.array_equal(t[:len(toks)], toks):
                self.entries.move_to_end(k)  # already held, as this or a longer entry
                return
            if len(t) < len(toks) and np.array_equal(toks[:len(t)], t):
                self._drop(k)  # the new one holds it
        while self.entries and self.bytes + size > self.budget:
            self._drop(next(iter(self.entries)))
        self._key += 1
        self.entries[self._key] = (toks, kv)
        self.bytes += size

    def _drop(self, k) -> None:
        self.bytes -= self.entries.pop(k)[1].nbytes

    def stats(self) -> dict:
        return {"entries": len(self.entries), "bytes": self.bytes, "budget": self.budget, "lookups": self.lookups,
                "hits": self.hits, "hit_tokens": self.hit_tokens}


def exact(model, chunk: int) -> bool:
    """Whether a prompt whose first P tokens' K/V are copied from another row's prefill and the rest prefilled
    gives the K/V and logits of the whole prompt prefilled at once, bit for bit (P at and past MIN_HIT, across
    a chunk's boundary), on a pool of two rows of its own."""
    pool = model.new_pool(2)
    n = min(pool.buckets[-1] - 1, MIN_HIT + 2 * chunk + 3)
    if n <= MIN_HIT + 1:
        return False
    ids = np.random.default_rng(0).integers(0, model.entry.arch["vocab_size"], n).tolist()
    pool.reserve(n)
    whole, _ = feed(model, pool.row(0), ids)
    for P in sorted({MIN_HIT, min(MIN_HIT + chunk // 2 + 1, n - 1)}):
        pool.n[1] = 0
        pool.load_prefix(1, pool.prefix(0, P), P)
        rest, _ = feed(model, pool.row(1), ids[P:])
        if not (np.array_equal(whole, rest) and np.array_equal(pool.data[:, :, 0, :, :n], pool.data[:, :, 1, :, :n])):
            return False
    return True
