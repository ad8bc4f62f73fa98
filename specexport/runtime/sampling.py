"""Samplers: pure functions over logits. Nothing here knows about models or caches.

Two exact ways to sample speculatively:
- "gumbel" (default): position p gets its own noise g_p = Gumbel(seed, p) over the vocabulary, and the
  token at p is argmax(log p_warped + g_p). Since g_p is independent of everything before p, the token is
  an exact sample of p_warped. The draft proposes with the same g_p on its own log q, and the target's
  argmax decides: the output is a function of (seed, target) alone, so the same seed gives the same text
  with any draft, any k, or no speculation at all.
- "rejection" (Leviathan et al. / Chen et al.): accept a drafted x with probability min(1, p(x) / q(x)),
  on rejection sample from norm(max(0, p - q)); exact in distribution, not reproducible across drafts.
Greedy is temperature 0: argmax of the raw logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

Sampler = Literal["gumbel", "rejection"]
SAMPLERS = get_args(Sampler)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    sampler: Sampler = "gumbel"

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2 ** 63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def kept(logits: np.ndarray, sp: SamplingParams) -> tuple[np.ndarray | None, np.ndarray]:
    """The tokens sampling may pick after temperature, top-k, top-p (transformers' order and tie rules) and
    their scores: log-probabilities up to one shared constant. logits [V] -> (ids [n] ascending, or None for
    every token; scores [n or V] float64). Works on the few kept tokens where it can: a full float64 pass
    over 49k logits costs ~1 ms a token here (numpy's float64 exp is scalar; its float32 exp is SIMD)."""
    inv = 1.0 / sp.temperature
    kth = np.partition(logits, -sp.top_k)[-sp.top_k] if sp.top_k and sp.top_k < len(logits) else None
    if sp.top_p == 1.0:
        if kth is None:
            return None, logits.astype(np.float64) * inv
        ids = np.flatnonzero(logits >= kth)
        return ids, logits[ids].astype(np.float64) * inv
    # transformers' TopPLogitsWarper sorts ascending and drops the tokens whose cumulative probability is
    # <= 1 - top_p. Only the most likely tokens can survive, so sort just those within `gap` of the best,
    # the gap doubling until they hold more than top_p (a full sort of 49k logits took 4.6 ms a token).
    # A threshold keeps every tie of the smallest kept value, in index order, as the stable sort does.
    best = float(logits.max())
    e = np.exp((logits - best) * np.float32(inv))  # float32, SIMD: only the normaliser comes from it
    if kth is not None:
        e[logits < kth] = 0.0
    z = float(e.sum(dtype=np.float64))
    gap = 8.0
    while True:
        top = np.flatnonzero(logits >= (best - gap * sp.temperature if gap < 1e4 else -np.inf))
        if kth is not None:
            top = top[logits[top] >= kth]
        x = logits[top].astype(np.float64) * inv
        p = np.exp(x - best * inv) / z
        if gap >= 1e4 or p.sum() > sp.top_p:
            break
        gap *= 2
    order = np.argsort(x, kind="stable")  # ascending; ties in index order
    rest = max(1.0 - p.sum(), 0.0) if gap < 1e4 else 0.0  # the rest hold < 1 - top_p: all of them are dropped
    drop = rest + np.cumsum(p[order]) <= 1.0 - sp.top_p
    drop[-1] = False  # always keep the most likely token
    keep = np.sort(order[~drop])
    return top[keep], x[keep]


def warp(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """log-probabilities after temperature, top-k, top-p; -inf = removed. logits: [V] -> [V] float64."""
    ids, x = kept(logits, sp)
    if ids is None:
        return x - logsumexp(x)
    y = np.full(len(logits), -np.inf)
    y[ids] = x - logsumexp(x)
    return y


def logsumexp(x: np.ndarray) -> float:
    m = np.max(x)
    return m + math.log(np.sum(np.exp(x - m)))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (Steele et al. 2014): a bijection of uint64 with full avalanche."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _bits(seed: int, position: int, ids) -> np.ndarray:
    """53 random bits per token id: output id+1 of a SplitMix64 stream keyed by (seed, position)."""
    ids = np.arange(ids, dtype=np.uint64) if isinstance(ids, int) else np.asarray(ids).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix64(np.array([seed], dtype=np.uint64) + _mix64(np.array([position], dtype=np.uint64) + _GOLDEN))
        return _mix64(key + (ids + np.uint64(1)) * _GOLDEN) >> np.uint64(11)


def gumbel_noise(seed: int, position: int, ids: np.ndarray | int) -> np.ndarray:
    """g_p[ids]: standard Gumbel noise for token ids (or all of range(ids)) that depends only on (seed,
    absolute position, token id), so any subset costs only its own size."""
    u = (_bits(seed, position, ids).astype(np.float64) + 0.5) * 2.0 ** -53  # in (0, 1)
    return -np.log(-np.log(u))


def gumbel_argmax(ids: np.ndarray | None, x: np.ndarray, seed: int, position: int, gap: float = 8.0) -> int:
    """argmax_j(x_j + g_p[j]) over tokens ids (None = all, x [V]): an exact sample of softmax(x), the token a
    full pass over every token's noise picks, at a fraction of its cost. Noise is drawn for the tokens within
    `gap` of the best; another token j can only win with g_j > M - x_j > c (M the best score so far), i.e.
    with a uniform above exp(-exp(-c)): only those few get their noise computed too."""
    ids = np.arange(len(x)) if ids is None else ids
    if len(ids) <= 1024:
        return int(ids[np.argmax(x + gumbel_noise(seed, position, ids))])
    near = np.flatnonzero(x >= x.max() - gap)
    M = float(np.max(x[near] + gumbel_noise(seed, position, ids[near])))
    c = M - (x.max() - gap)  # every other token scores below x.max() - gap
    rest = np.flatnonzero(_bits(seed, position, ids) >= math.floor(math.exp(-math.exp(-c)) * 2.0 ** 53) - 2)
    cand = np.union1d(near, rest)  # a superset of the tokens that can win
    return int(ids[cand[np.argmax(x[cand] + gumbel_noise(seed, position, ids[cand]))]])


def probs(logp: np.ndarray) -> np.ndarray:
    return np.exp(logp)


def sample_from(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector p: [V] (need not be exactly normalised)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def accept_rejection(p: np.ndarray, q: np.ndarray, x: int, rng: np.random.Generator) -> int | None:
    """Classic speculative acceptance of draft token x: None if accepted, else the replacement token.
    p, q: [V] target and draft probabilities (already warped)."""
    # accept with probability min(1, p(x) / q(x))
    if q[x] > 0 and rng.random() * q[x] < p[x]:
        return None
    residual = np.maximum(p - q, 0.0)  # on rejection, sample from norm(max(0, p - q))
    if residual.sum() <= 0:  # p == q up to rounding: any sample of p is exact
        residual = p
    return sample_from(residual, rng)
