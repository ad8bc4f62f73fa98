"""The draft-model drafter: a draft model of the bundle (separate checkpoint, early-exit slice, int4/int8
copy) with its own KV ring buffer; it catches up on the tokens it has not seen, then proposes k. A self-draft
with the target's KV layout (an int4/int8 copy) reads the target's cache instead (kv.SharedKV): no prefill
and no cache of its own.
"""
from __future__ import annotations

from ...backends.base import Backend
from ..kv import RingKV, SharedKV
from ..prefill import feed
from .base import Choose, Proposal


def shares_cache(target: Backend, draft: Backend) -> bool:
    """Can `draft` read `target`'s cache: a self-draft (int4/int8 copy) with the same cache shape, both on
    numpy caches (onnxruntime CPU)."""
    return (draft.entry.kind in ("int4", "int8") and target.host_cache and draft.host_cache
            and draft.dims == target.dims and draft.buckets == target.buckets)


class ModelDrafter:
    def __init__(self, model: Backend, share: bool = False):
        self.model, self.share = model, share
        self.cache: RingKV | None = None

    def start(self, prompt: list[int], target_cache: RingKV | None = None) -> float:
        if self.share and target_cache is not None:  # the target's prefill serves both
            self.cache = SharedKV(target_cache)
            return 0.0
        self.cache = self.model.new_cache()
        return feed(self.model, self.cache, prompt[:-1])[1]

    def propose(self, tokens: list[int], k: int, choose: Choose) -> Proposal:
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
        return Proposal(props, qs, s)

    def accepted(self, n_before: int, a: int, k: int) -> None:
        """Keep the draft's K/V whose inputs were committed: positions < n_before + min(a, k-1) (a shared
        cache starts from the target's at each proposal instead)."""
        self.cache.truncate(min(self.cache.n, n_before + min(a, k - 1)))
