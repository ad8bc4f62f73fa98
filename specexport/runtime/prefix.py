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
token is always computed: its logits give the first token). Entries live in a ring of token slots within a byte
budget, the oldest out first; an entry that another extends is dropped for the longer one.
"""
from __future__ import annotations

import weakref

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
    """Entries in one ring of token slots, `arena` [L, 2, Hkv, slots, D], allocated once (np.zeros: its pages are
    mapped as first written and then stay): a new entry takes the next run of slots and evicts the entries
    there, the oldest first (the ring wraps to slot 0 when a run would pass its end). Copies into fresh arrays
    instead (one per entry, ~9 MB for a SmolLM2 request of 200 tokens) took 3-9 ms each on a 2-core VM (the new
    pages' faults, it seems; not profiled): 0.1-0.3 s of an 11 s burst at 8 requests (2026-12-06, `epyc-zen3`)."""

    def __init__(self, budget_bytes: int, row: np.ndarray):
        """row: one pool row's buffer [L, 2, Hkv, S, D] (its shape and dtype)."""
        L, two, H, _, D = row.shape
        token = L * two * H * D * row.dtype.itemsize
        self.slots = int(budget_bytes) // token
        self.arena = np.zeros((L, two, H, self.slots, D), dtype=row.dtype) if self.slots else None
        self.budget, self.token_bytes = self.slots * token, token
        self.entries: dict = {}  # first slot -> tokens int64 [P], oldest first
        self.head = 0  # where the next entry goes
        self.hits = self.hit_tokens = self.lookups = 0

    def lookup(self, ids: list) -> tuple[int, np.ndarray | None]:
        """The longest cached prefix of `ids` -> (P, a view of its K/V [L, 2, Hkv, P, D]), or (0, None). The view
        is the arena's: read it before the next insert."""
        self.lookups += 1
        ids = np.asarray(ids, dtype=np.int64)
        best, at = 0, None
        for a, toks in self.entries.items():
            m = min(len(toks), len(ids) - 1)
            if m <= best:
                continue
            same = toks[:m] == ids[:m]
            p = m if same.all() else int(np.argmin(same))
            if p > best:
                best, at = p, a
        if best < MIN_HIT:
            return 0, None
        self.hits, self.hit_tokens = self.hits + 1, self.hit_tokens + best
        return best, self.arena[:, :, :, at:at + best]

    def insert(self, ids: list, src: np.ndarray) -> None:
        """Keep the K/V of tokens ids, copied from src [L, 2, Hkv, >=len(ids), D] (a pool row's buffer)."""
        toks = np.asarray(ids, dtype=np.int64)
        P = len(toks)
        if P < MIN_HIT or P > self.slots:
            return
        for a, t in list(self.entries.items()):
            if len(t) >= P and np.array_equal(t[:P], toks):
                return  # already held, as this or a longer entry
            if len(t) < P and np.array_equal(toks[:len(t)], t):
                del self.entries[a]  # the new one holds it
        if self.head + P > self.slots:
            self.head = 0
        lo, hi = self.head, self.head + P
        for a, t in list(self.entries.items()):
            if a < hi and lo < a + len(t):
                del self.entries[a]
        self.arena[:, :, :, lo:hi] = src[:, :, :, :P]
        self.entries[lo] = toks
        self.head = hi

    @property
    def bytes(self) -> int:
        return sum(len(t) for t in self.entries.values()) * self.token_bytes

    def stats(self) -> dict:
        return {"entries": len(self.entries), "bytes": self.bytes, "budget": self.budget, "lookups": self.lookups,
                "hits": self.hits, "hit_tokens": self.hit_tokens}


def exact(model, chunk: int) -> bool:
    """Whether a prompt whose first P tokens' K/V are copied from another row's prefill and the rest prefilled
    gives the K/V and logits of the whole prompt prefilled at once, bit for bit (P at and past MIN_HIT, across
    a chunk's boundary), on a pool of two rows of its own. Once per loaded model (~0.5 s for SmolLM2 on 2 cores;
    `specexport bench` starts an engine per run)."""
    if model not in _exact:
        _exact[model] = _check(model, chunk)
    return _exact[model]


_exact: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check(model, chunk: int) -> bool:
    pool = model.new_pool(2)
    n = min(pool.buckets[-1] - 1, MIN_HIT + 2 * chunk + 3)
    if n <= MIN_HIT + 1:
        return False
    ids = np.random.default_rng(0).integers(0, model.entry.arch["vocab_size"], n).tolist()
    pool.reserve(n)
    whole, _ = feed(model, pool.row(0), ids)
    for P in sorted({MIN_HIT, min(MIN_HIT + chunk // 2 + 1, n - 1)}):
        pool.n[1] = 0
        pool.load_prefix(1, pool.data[:, :, 0], P)
        rest, _ = feed(model, pool.row(1), ids[P:])
        if not (np.array_equal(whole, rest) and np.array_equal(pool.data[:, :, 0, :, :n], pool.data[:, :, 1, :, :n])):
            return False
    return True
