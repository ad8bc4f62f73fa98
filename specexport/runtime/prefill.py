"""Prefill: run a prompt through a model in chunks of its profiles, committing every row. The target, a
draft model and the engine's admitted requests all prefill this way.
"""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np

from ..backends.base import Backend
from .kv import RingKV

# what a call of T tokens costs, in prompt tokens: call_cost + T. A call reads every weight once, which on
# these CPUs costs about as much as 16 tokens of prefill compute on onnxruntime in float32 (a 1-token call
# ~32 ms, a 64-token one ~135 ms, 128 ~270 ms on SmolLM2, 2 cores); a padded row costs as much as a real one.
# A backend whose tokens are cheaper against its per-call cost says so in its `call_cost` (OpenVINO in bf16
# on AMX: ~52, experiments/call_cost_probe.py)
CALL_COST = 16
# a backend that runs any T (`any_t`) and prefills with nobody else waiting takes up to this many tokens a call,
# past its largest prefill profile: a 1,500-token prompt in 512-token calls 0.89-0.95x the time of 256-token ones
# in float32, 0.96-1.02x in bf16dot (fewer reads of every weight; 768 and 1,500 gained nothing more; 2026-12-05,
# xeon-m207, experiments/prefill_chunks_ab.py, docs/benchmarks.md "Prefill in longer calls, without the LM head")
ALONE_CHUNK = 512


@lru_cache(maxsize=64)
def _plans(sizes: tuple, call_cost: int = CALL_COST) -> list[int]:
    """first[r] for r < max(sizes): the T of the first call of the cheapest sequence of calls of `sizes` whose
    T add up to at least r (the last may be padded), a call costing call_cost + T; the larger
    first among equals."""
    cost, first = [0.0], [0]
    for r in range(1, sizes[-1]):
        c, neg_t = min((call_cost + t + cost[max(r - t, 0)], -t) for t in sizes)  # -t: the larger T on a tie
        cost.append(c)
        first.append(-neg_t)
    return first


def chunk_ts(model: Backend, limit: int | None = None) -> tuple:
    """The T values a prefill call may use: every profile of the model, at most `limit` (the smallest kept)."""
    sizes = sorted(set(model.entry.profiles.values()))
    return tuple(t for t in sizes if limit is None or t <= limit) or (sizes[0],)


def feed_chunk(model: Backend, cache: RingKV, ids: list[int], i: int, limit: int | None = None):
    """Run the next chunk of `ids` from index i at positions cache.n.., committing its rows -> (i, r, StepOut):
    r ids were fed. The chunk is the first call of the cheapest plan for what is left (`_plans`: the largest
    profile while it fits, a padded remainder when padding costs less than more calls; on a backend that runs
    any T, the rest unpadded, up to ALONE_CHUNK tokens a call), with T <= `limit` when given (the engine's budget
    while others decode). Pad rows are never committed. Only the last chunk of `ids` gets logits, of its last
    row: the LM head of every other row is skipped (a fused graph's; SmolLM2's LM head in float32 is a 113 MB
    read, ~2 ms of a 256-token chunk on 2 cores, ~4 ms of a bf16dot one); StepOut.logits has no rows then."""
    room = max(1, cache.buckets[-1] - cache.n)  # a padded chunk must fit too: near the capacity only the T that do
    T, r = next_chunk(model, len(ids) - i, room if limit is None else min(limit, room), alone=limit is None)
    out = model.step(cache, ids[i:i + r] + [0] * (T - r), cache.n, rows=[r - 1] if i + r == len(ids) else [])
    cache.commit(out.new_kv, range(r))
    return i, r, out


def next_chunk(model: Backend, left: int, limit: int | None = None, alone: bool = False) -> tuple[int, int]:
    """(T, r) of the next prefill call for `left` prompt tokens: its profile and the tokens it takes (the rest
    of T is padding), as `feed_chunk` runs it. A backend that runs any T (`any_t`) takes min(left, the largest
    profile within `limit`) tokens, unpadded: a 1,500-token prompt's sixth chunk of 220 tokens costs 0.87x the
    padded 256 (one call where the profiles took three for 200 tokens: 0.85x the time; 2026-12-05, epyc-zen4);
    `alone` (no budget: nobody else waits on this call) up to ALONE_CHUNK."""
    sizes = chunk_ts(model, limit)
    if getattr(model, "any_t", False):  # no padding: the rest of the prompt in one call when it fits
        T = min(left, max(sizes[-1], ALONE_CHUNK) if alone else sizes[-1], limit or left)
        return T, T
    T = sizes[-1] if left >= sizes[-1] else _plans(sizes, getattr(model, "call_cost", CALL_COST))[left]
    return T, min(T, left)


def feed(model: Backend, cache: RingKV, ids: list[int]) -> tuple[np.ndarray, float]:
    """Run `ids` through `model` at positions cache.n.. in chunks of its profiles (feed_chunk), committing
    every row -> (logits of the last id [V], seconds inside the backend)."""
    spent, out, i = 0.0, None, 0
    while i < len(ids):
        i, r, out = feed_chunk(model, cache, ids, i)
        spent, i = spent + out.run_s, i + r
    return (None if out is None else out.logits[0]), spent


def measured_entry(model: Backend, trees: bool = True):
    """The model's manifest entry with its verify-vs-decode drift measured on the backend at hand
    (`verify_drifts`): beyond the bundle's tolerance a chain drift loads the target plain-only (drafts are
    refused with the number) and a tree drift makes it take chain drafts only (`exact_trees` False; also
    when `trees` is False: numerics known to round a tree's rows apart on text the check does not cover)."""
    e, tol = model.entry, model.entry.parity_tolerance or 1e-3
    chain, tree = verify_drifts(model)
    return dataclasses.replace(e, verify_drift=max(chain, tree), speculative=e.speculative and chain <= tol,
                               exact_trees=e.exact_trees and trees and tree <= tol)


def verify_drifts(model: Backend, seed: int = 0, n_past: int | None = None) -> tuple[float, float]:
    """Largest |logit difference| between scoring tokens in one verify call (the largest verify profile) and
    scoring them one decode call at a time, same tokens and cache -> (for a chain of T tokens, for a tree of
    two branches from one root whose second branch is decoded as root, then its nodes (in the call they sit
    after the first branch's)). Small (float32 rounding: a row sums its keys in another order than a decode
    call would) or zero for float32 math; large when the math rounds each partial sum (quantised
    activations, or bfloat16 with the new tokens' keys summed apart from the cache's), where one flip
    cascades. A chain's rows can be bit-identical to decoding where a tree's are not: a branch's keys sit at
    other offsets of the call than once committed, and vectorised sums (softmax's) group them differently."""
    V = model.entry.arch["vocab_size"]
    T = max(model.entry.profiles[f"verify_{k}"] for k in model.entry.verify_ks())
    if n_past is None:  # (a prompt's first chunk and a few decode steps: the cached keys the check sums)
        n_past = max(1, min(model.capacity - T, model.entry.profiles.get("prefill", 1) + 3))
    ids = np.random.default_rng(seed).integers(0, V, n_past + T).tolist()
    h = 1 + (T - 1) // 2  # the tree: root 0, branch [1, h) and branch [h, T), each a chain from the root
    parent = [-1] + list(range(0, h - 1)) + ([0] + list(range(h, T - 1)) if T > h else [])
    mask = np.eye(T, dtype=bool)
    for i in range(T):
        j = parent[i]
        while j >= 0:
            mask[i, j], j = True, parent[j]
    drifts = []
    for new_mask, path in ((None, list(range(T))), (mask, [0] + list(range(h, T)))):
        worst = 0.0
        cache = model.new_cache()
        feed(model, cache, ids[:n_past])
        pos = None if new_mask is None else n_past + mask.sum(1) - 1  # a node's position: its depth
        together = model.step(cache, ids[n_past:], n_past, new_mask=None if new_mask is None else new_mask[None],
                              positions=pos).logits
        for d, i in enumerate(path):
            out = model.step(cache, [ids[n_past + i]], n_past + d)
            cache.commit(out.new_kv, [0])
            worst = max(worst, float(np.abs(together[i] - out.logits[0]).max()))
        drifts.append(worst)
    return drifts[0], drifts[1]
