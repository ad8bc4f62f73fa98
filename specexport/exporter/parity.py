"""Parity: every exported profile on onnxruntime against transformers' eager model, same tokens, with a
partly filled cache (filled through the graph's own chunked prefill, so that is checked too)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ..backends.ort import OrtBackend
from ..runtime.prefill import feed, verify_drifts  # noqa: F401 -- the build's checks, shared with the runtime


@contextlib.contextmanager
def first_layers(hf, n: int | None):
    """Temporarily cut an HF model to its first n layers (the early-exit draft's reference)."""
    if n is None:
        yield hf
        return
    layers, count = hf.model.layers, hf.config.num_hidden_layers
    hf.model.layers, hf.config.num_hidden_layers = layers[:n], n
    try:
        yield hf
    finally:
        hf.model.layers, hf.config.num_hidden_layers = layers, count


def eager_logits(hf, ids: list[int], layers: int | None = None) -> np.ndarray:
    """[n, V] float32 logits of transformers' eager forward over ids."""
    with torch.no_grad(), first_layers(hf, layers):
        return hf(torch.tensor([ids])).logits[0].float().numpy()


def check(hf, model: OrtBackend, layers: int | None = None, seed: int = 0, tick=None) -> dict:
    """-> {profile: {"max_abs": float, "top1": agreement}} for every profile of `model`, each in the smallest
    capacity bucket that fits, plus "decode@capacity": the decode profile with the cache at full capacity.
    tick(profile name), if given, is called as each profile's check begins (progress)."""
    S = model.capacity
    V = model.entry.arch["vocab_size"]
    P = model.entry.profiles.get("prefill", 1)
    T_max = max(model.entry.profiles.values())
    n_past = max(1, min(S - T_max, 2 * P + 3))  # two full prefill chunks and a padded remainder
    ids = np.random.default_rng(seed).integers(0, V, n_past + T_max).tolist()
    ref = eager_logits(hf, ids, layers)
    report = {}
    runs = sorted(model.entry.profiles.items(), key=lambda x: x[1]) + [("decode@capacity", 1)]
    for name, T in runs:
        if tick is not None:
            tick(name)
        cache = model.new_cache()
        if name == "decode@capacity":
            cache.reserve(S)
        feed(model, cache, ids[:n_past])
        out = model.step(cache, ids[n_past:n_past + T], n_past)
        want = ref[n_past:n_past + T]
        report[name] = {"T": T, "S": cache.S, "max_abs": float(np.abs(out.logits - want).max()),
                        "top1": float((out.logits.argmax(-1) == want.argmax(-1)).mean())}
    return report


def check_batch(hf, model: OrtBackend, B: int, layers: int | None = None, seed: int = 1) -> dict:
    """-> {"batch_B{B}_T{T}": ...} for the largest T the batching engine runs in a B-row call (a decode or
    verify step, or the first prefill chunks of neighbouring requests: the "prefill" profile; the long
    prefill profiles run one row at a time): B rows at different cache lengths (each prefilled through its
    own pool row), one batched call, every row against transformers' eager logits of its own sequence."""
    V = model.entry.arch["vocab_size"]
    P = model.entry.profiles.get("prefill", 1)
    engine_ts = {t for name, t in model.entry.profiles.items() if not name.startswith("prefill")} | {P}
    T = max(t for t in model.batch_ts(B) if t in engine_ts)
    longest = max(2, min(model.capacity - T, 2 * P + 3))
    rng = np.random.default_rng(seed)
    lengths = [max(1, longest - (b * longest) // B) for b in range(B)]  # longest, ..., shortest
    seqs = [rng.integers(0, V, n + T).tolist() for n in lengths]
    pool = model.new_pool(B)
    for b, (n, ids) in enumerate(zip(lengths, seqs)):
        assert pool.acquire() == b
        feed(model, pool.row(b), ids[:n])
    ids = np.array([s[n:n + T] for n, s in zip(lengths, seqs)])
    pos = np.array([np.arange(n, n + T) for n in lengths])
    out = model.step_batch(pool, ids, pos)
    worst, agree = 0.0, []
    for b, (n, s) in enumerate(zip(lengths, seqs)):
        want = eager_logits(hf, s, layers)[n:n + T]
        worst = max(worst, float(np.abs(out.logits[b] - want).max()))
        agree.append((out.logits[b].argmax(-1) == want.argmax(-1)).mean())
    return {f"batch_B{B}_T{T}": {"T": T, "S": pool.S, "B": B, "cache_lengths": lengths, "max_abs": worst,
                                 "top1": float(np.mean(agree))}}


def check_mixed(model: OrtBackend, seed: int = 2) -> float:
    """Largest |logit difference| between the mixed graph's calls and the fused graph's calls of the same
    tokens: B decode rows at different cache lengths with a prefill chunk (one group) on a row inside the
    batch, then one row verifying a tree in the batch (B = 1) with each group verifying a chain. Both write
    only free slots, so the two run on the same pool."""
    V = model.entry.arch["vocab_size"]
    B = max(model.batch_sizes)
    P = model.entry.profiles.get("prefill", 1)
    Tv = max(model.entry.profiles[f"verify_{k}"] for k in model.entry.verify_ks())
    rng = np.random.default_rng(seed)
    room = model.capacity - max(P, Tv) - 2
    lengths = [max(1, min(room, 3 + 5 * b)) for b in range(B)]
    pool = model.new_pool(B)
    for n in lengths:
        feed(model, pool.row(pool.acquire()), rng.integers(0, V, n).tolist())
    worst = 0.0
    # decode rows + a chunk on the last row
    r = B - 1
    chunk = rng.integers(0, V, P).tolist()
    ids = rng.integers(0, V, (B, 1))
    pos = pool.n[:B, None].astype(np.int64).copy()
    out, (g,) = model.step_mixed(pool, ids, pos, None, [(r, chunk, np.arange(pool.n[r], pool.n[r] + P), None, None)])
    ref = model.step_batch(pool, ids, pos)
    worst = max(worst, float(np.abs(out.logits[:r] - ref.logits[:r]).max()))
    solo = model.step(pool.row(r), chunk, int(pool.n[r]))
    worst = max(worst, float(np.abs(g.logits - solo.logits).max()))
    # a verify call of row 0 as the batch (B = 1) and chains on the next rows as groups
    groups = []
    for j in range(1, min(model.groups, B - 1) + 1):
        toks = rng.integers(0, V, Tv).tolist()
        groups.append((j, toks, np.arange(pool.n[j], pool.n[j] + Tv), None, None))
    if groups:
        ids = rng.integers(0, V, (1, Tv))
        pos = (pool.n[0] + np.arange(Tv))[None].astype(np.int64)
        out, gs = model.step_mixed(pool, ids, pos, None, groups)
        ref = model.step_batch(pool, ids, pos)
        worst = max(worst, float(np.abs(out.logits - ref.logits).max()))
        for (j, toks, p, _, _), g in zip(groups, gs):
            worst = max(worst, float(np.abs(g.logits - model.step(pool.row(j), toks, int(pool.n[j])).logits).max()))
    return worst
