"""The decode loop: propose -> verify -> accept -> commit, one small function each. Batch of one.

Cache convention: the target's cache holds every committed token but the last; a step feeds
[last committed, d1..dk] at positions N-1..N+k-1 (N = tokens so far) and row i of the logits predicts
the token at position N+i. Accepting a drafts commits rows 0..a and emits a+1 tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .backends import Backend
from .drafters import ModelDrafter, NgramDrafter, feed
from .sampling import SamplingParams, accept_rejection, gumbel_argmax, kept, probs, sample_from, warp
from .tree import TreeSizer, accept_tree

DRAFTS = ("model", "ngram", "recycle", "none")


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 128
    k: int = 4
    draft: str = "model"  # model | ngram | recycle | none
    sampling: SamplingParams = SamplingParams()
    ngram: int = 3  # longest n-gram the ngram drafter matches
    adaptive: bool = False  # choose k per step among the built verify profiles (k is then the largest)
    # recycle: k is the most tree nodes per step; the size is always chosen per step among profiles <= k

    def __post_init__(self):
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        if self.draft not in DRAFTS:
            raise ValueError(f"draft must be one of {', '.join(DRAFTS)}, got {self.draft!r}")
        if not (isinstance(self.k, int) and self.k >= 1):
            raise ValueError(f"k must be an integer >= 1, got {self.k}")


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0  # target calls after the prefill
    proposed: int = 0
    accepted: int = 0
    hist: list = field(default_factory=list)  # hist[a] = steps that accepted a drafts
    prefill_s: float = 0.0
    draft_s: float = 0.0  # inside the draft model's run calls
    verify_s: float = 0.0  # inside the target's run calls after the prefill
    total_s: float = 0.0

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target step (accepted drafts + 1)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def host_s(self) -> float:
        return max(self.total_s - self.prefill_s - self.draft_s - self.verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s else 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(tau=self.tau, acceptance=self.acceptance, host_s=self.host_s, tokens_per_s=self.tokens_per_s)
        return d


class Picker:
    """Chooses tokens for one generation: greedy argmax, Gumbel-max with per-position noise, or draws for
    the rejection sampler. The noise is a function of (seed, position, token), so draft and target see the
    same g_p without keeping it."""

    def __init__(self, sp: SamplingParams):
        self.sp = sp
        self.rng = np.random.default_rng(sp.seed)

    def target(self, logits: np.ndarray, pos: int) -> int:
        if self.sp.greedy:
            return int(np.argmax(logits))
        if self.sp.sampler == "gumbel":
            return gumbel_argmax(*kept(logits, self.sp), self.sp.seed, pos)
        return sample_from(probs(warp(logits, self.sp)), self.rng)

    def draft(self, logits: np.ndarray, pos: int) -> tuple[int, np.ndarray | None]:
        if self.sp.greedy or self.sp.sampler == "gumbel":
            return self.target(logits, pos), None
        q = probs(warp(logits, self.sp))
        return sample_from(q, self.rng), q


def accept(logits: np.ndarray, props: list[int], qs: list, pos0: int, pick: Picker) -> list[int]:
    """Tokens to emit after verifying `props`: logits [>=m+1, V], row i predicts position pos0+i."""
    out = []
    for i, d in enumerate(props):
        if pick.sp.greedy or pick.sp.sampler == "gumbel":
            t = pick.target(logits[i], pos0 + i)  # the target's own token; the draft only saved time
            out.append(t)
            if t != d:
                return out
        else:
            p = probs(warp(logits[i], pick.sp))
            q = qs[i] if qs[i] is not None else np.eye(1, len(p), d)[0]  # ngram: a point mass
            r = accept_rejection(p, q, d, pick.rng)
            out.append(d if r is None else r)
            if r is not None:
                return out
    out.append(pick.target(logits[len(props)], pos0 + len(props)))  # the bonus token
    return out


class KPolicy:
    """Adaptive k: pick the draft length with the most expected tokens per second, from this generation's
    running acceptance rate and measured step costs; for a free drafter (n-gram) also k = 0 (plain decoding)
    when speculation does not pay -- a draft model that skipped steps would have to catch up later.
    With acceptance rate a, a step proposing k tokens emits E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs
    k * (draft time per token) + verify time at T = k+1. Every `probe` plain steps it speculates once with
    the smallest k, so a stale estimate can recover."""

    def __init__(self, ks: list[int], verify_ts: dict, allow_plain: bool = True, probe: int = 8, decay: float = 0.9):
        self.ks, self.verify_ts, self.probe, self.decay = ks, verify_ts, probe, decay
        self.allow_plain = allow_plain  # a draft model that skips steps must catch up later: never plain
        self.acc, self.prop = 1.0, 2.0  # prior: acceptance 0.5
        self.draft_cost: float | None = None  # seconds per drafted token
        self.step_cost: dict = {}  # T -> seconds per target call
        self.plain_run = 0

    def choose(self) -> int:
        c1 = self.step_cost.get(1)
        if self.draft_cost is None or (c1 is None and self.allow_plain):
            return self.ks[0] if self.draft_cost is None else 0  # measure a speculative and a plain step first
        c1 = c1 or min(self.step_cost.values())  # no plain step measured: the cheapest verify bounds it
        a = min(self.acc / self.prop, 0.999)
        best, rate = (0, 1.0 / c1) if self.allow_plain else (self.ks[0], 0.0)
        for k in self.ks:
            T = self.verify_ts[k]
            cost = k * self.draft_cost + self.step_cost.get(T, c1 * (1 + 0.05 * (T - 1)))
            r = (1 - a ** (k + 1)) / (1 - a) / cost
            if r > rate:
                best, rate = k, r
        self.plain_run = self.plain_run + 1 if best == 0 else 0
        return self.ks[0] if self.plain_run > self.probe else best

    def update(self, proposed: int, accepted: int, T: int, verify_s: float, draft_s: float) -> None:
        ema = lambda old, new: new if old is None else 0.8 * old + 0.2 * new  # noqa: E731
        self.step_cost[T] = ema(self.step_cost.get(T), verify_s)
        if proposed:
            self.acc, self.prop = self.decay * self.acc + accepted, self.decay * self.prop + proposed
            self.draft_cost = ema(self.draft_cost, draft_s / proposed)
            self.plain_run = 0


def check_finite(logits: np.ndarray, role: str) -> None:
    if not np.isfinite(logits).all():
        raise FloatingPointError(f"the {role} model produced NaN or inf logits; the bundle's graph or weights "
                                 "are broken: rebuild it and check its parity report")


def generate(target: Backend, drafter, prompt: list[int], cfg: DecodeConfig, stats: Stats) -> Iterator[list[int]]:
    """Yield the tokens accepted at each step (at most cfg.max_new_tokens in all). Stops on max tokens only;
    the caller stops on EOS and stop strings by closing the generator. `drafter`: ModelDrafter, NgramDrafter,
    RecycleDrafter (a tree per step) or None."""
    t0 = time.perf_counter()
    verify_ts = {k: target.entry.profiles[f"verify_{k}"] for k in target.entry.verify_ks()}
    pick = Picker(cfg.sampling)
    tree = getattr(drafter, "tree", False)
    stats.prompt_tokens = len(prompt)
    stats.hist = [0] * (cfg.k + 1)
    cache = target.new_cache()
    # the prompt's rows get no logits, so the recycle drafter does not learn from the prompt: measured on 26
    # Spec-Bench questions, learning from it raised tokens per step 1.629 -> 1.648 but cost 17% more prefill
    _, stats.prefill_s = feed(target, cache, prompt[:-1])
    if drafter is not None:
        drafter.start(prompt, cache)
        stats.prefill_s += drafter.run_s
        drafter.run_s = 0.0
    tokens = list(prompt)
    policy = (KPolicy(sorted(verify_ts), verify_ts, allow_plain=isinstance(drafter, NgramDrafter))
              if cfg.adaptive and drafter is not None and not tree else None)
    sizer = TreeSizer([1] + [T for k, T in verify_ts.items() if k <= cfg.k]) if tree else None
    while stats.new_tokens < cfg.max_new_tokens:
        N = len(tokens)
        room = cfg.max_new_tokens - stats.new_tokens - 1  # drafts beyond this could not be emitted
        if tree:
            t = drafter.draft(tokens, cfg.k, room)
            T = sizer.choose(t)
            ids, pos, mask = t.inputs(T, N)
            out = target.step(cache, ids, N - 1, new_mask=mask, positions=pos)
            n = min(T, len(t))
            check_finite(out.logits[:n], "target")
            emitted, rows = accept_tree(out.logits, t, T, N, pick)
            drafter.verified(t, rows, emitted, out.logits[:n], out.top)
            sizer.update(T, out.run_s)
            proposed = n - 1
        else:
            k = min(policy.choose() if policy else cfg.k, room)
            props, qs = drafter.propose(tokens, k, pick.draft) if drafter is not None and k > 0 else ([], [])
            T = 1 if not props else next(t for t in sorted(verify_ts.values()) if t >= len(props) + 1)
            out = target.step(cache, [tokens[-1]] + props + [0] * (T - 1 - len(props)), N - 1)
            check_finite(out.logits[:len(props) + 1], "target")
            emitted = accept(out.logits, props, qs, N, pick)
            rows, proposed = range(len(emitted)), len(props)
            if drafter is not None and props:
                drafter.accepted(N, len(emitted) - 1, len(props))
        a = len(emitted) - 1
        cache.commit(out.new_kv, rows)
        tokens += emitted
        stats.steps += 1
        stats.proposed += proposed
        stats.accepted += a
        stats.hist[a] += 1
        stats.verify_s += out.run_s
        stats.new_tokens += len(emitted)
        if policy is not None:
            policy.update(proposed, a, T, out.run_s, drafter.run_s)
        if drafter is not None:
            stats.draft_s += drafter.run_s
            drafter.run_s = 0.0
        stats.total_s = time.perf_counter() - t0
        yield emitted
