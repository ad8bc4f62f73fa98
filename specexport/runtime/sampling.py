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

import numpy as np

SAMPLERS = ("gumbel", "rejection")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0
    sampler: str = "gumbel"

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


def warp(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """log-probabilities after temperature, top-k, top-p (transformers' order and tie rules); -inf = removed.
    logits: [V] -> [V] float64."""
    x = logits.astype(np.float64) / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = np.partition(x, -sp.top_k)[-sp.top_k]
        x = np.where(x < kth, -np.inf, x)
    x = x - _logsumexp(x)
    if sp.top_p < 1.0:
        # transformers' TopPLogitsWarper sorts ascending and drops the tokens whose cumulative probability is
        # <= 1 - top_p. Only the most likely tokens can survive, so sort just the m most likely, m growing
        # until they hold more than top_p (a full sort of 49k logits took 4.6 ms a token; this ~0.5 ms).
        p = np.exp(x)
        m = min(256, len(x))
        while True:
            top = np.argpartition(x, len(x) - m)[len(x) - m:] if m < len(x) else np.arange(len(x))
            if m == len(x) or p[top].sum() > sp.top_p:
                break
            m = min(8 * m, len(x))
        top = np.flatnonzero(x >= x[top].min())  # with every tie of the smallest, in index order (stable sort)
        order = top[np.argsort(x[top], kind="stable")]  # ascending
        rest = np.ones(len(x), dtype=bool)
        rest[top] = False
        cum = p[rest].sum() + np.cumsum(p[order])  # the rest hold < 1 - top_p: all of them are dropped
        drop = cum <= 1.0 - sp.top_p
        drop[-1] = False  # always keep the most likely token
        keep = order[~drop]
        y = np.full_like(x, -np.inf)
        y[keep] = x[keep]
        x = y - _logsumexp(y[keep])
    return x


def _logsumexp(x: np.ndarray) -> float:
    m = np.max(x)
    return m + math.log(np.sum(np.exp(x - m)))


def gumbel_noise(seed: int, position: int, vocab: int) -> np.ndarray:
    """g_p: [V] standard Gumbel noise that depends only on (seed, absolute position)."""
    rng = np.random.Generator(np.random.Philox(key=[seed, position]))
    u = rng.random(vocab)
    with np.errstate(divide="ignore"):
        return -np.log(-np.log(u))  # u = 0 gives -inf: that token is never picked


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
