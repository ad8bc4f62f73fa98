"""The solo decode loop (one sequence): prefill, then one step per target call -- chain_step for a chain
drafter (draft model, prompt lookup) or none, tree_step for a tree drafter (token recycling) -- each
propose -> verify -> accept -> commit. The batching engine (runtime/engine) runs the same steps for many
sequences in one call.

Cache convention: the target's cache holds every committed token but the last; a step feeds
[last committed, d1..dk] at positions N-1..N+k-1 (N = tokens so far) and row i of the logits predicts
the token at position N+i. Accepting a drafts commits rows 0..a and emits a+1 tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Literal, get_args

import numpy as np

from ..backends.base import Backend
from .accept import Picker, accept, accept_tree, check_finite
from .costs import ROW, StepCosts, chain_tokens
from .drafters import NgramDrafter, TreeDrafter
from .prefill import feed
from .sampling import SamplingParams

Draft = Literal["model", "ngram", "recycle", "none"]  # who proposes: a draft model, prompt lookup, token recycling
DRAFTS = get_args(Draft)


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int = 128
    k: int = 4
    draft: Draft = "model"
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
    cached_tokens: int = 0  # prompt tokens whose K/V came from the engine's prefix cache (not prefilled)
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
        """Mean tokens emitted per target step (accepted drafts + 1); the first token is the prefill's."""
        return (self.new_tokens - 1) / self.steps if self.steps else 0.0

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


class KPolicy:
    """Adaptive k: pick the draft length with the most expected tokens per second, from this generation's
    running acceptance rate and measured step costs; for a free drafter (n-gram) also k = 0 (plain decoding)
    when speculation does not pay -- a draft model that skipped steps would have to catch up later.
    With acceptance rate a, a step proposing k tokens emits E(k) = (1 - a^(k+1)) / (1 - a) tokens and costs
    k * (draft time per token) + verify time at T = k+1. Every `probe` plain steps it speculates once with
    the smallest k, so a stale estimate can recover."""

    def __init__(self, ks: list[int], verify_ts: dict, costs: StepCosts, allow_plain: bool = True,
                 probe: int = 8, decay: float = 0.9):
        self.ks, self.verify_ts, self.costs, self.probe, self.decay = ks, verify_ts, costs, probe, decay
        self.allow_plain = allow_plain  # a draft model that skips steps must catch up later: never plain
        # the per-token acceptance a = acc / tries: a chain's tokens are tried in order until the first miss, so
        # a step that accepted j of k tried j + 1 of them (k when all were accepted); the share accepted, j / k,
        # reads a rate of 0.8 at k = 4 as ~0.6 and sizes drafts too short
        self.acc, self.tries = 1.0, 2.0  # prior: acceptance 0.5
        self.draft_cost: float | None = None  # seconds per drafted token
        self.plain_run = 0

    def choose(self) -> int:
        if self.draft_cost is None or ((1, 1) not in self.costs.seen and self.allow_plain):
            return self.ks[0] if self.draft_cost is None else 0  # measure a speculative and a plain step first
        a = min(self.acc / self.tries, 0.999)
        best, rate = (0, 1.0 / self.costs.cost(1, 1)) if self.allow_plain else (self.ks[0], 0.0)
        for k in self.ks:
            r = chain_tokens(a, k + 1) / (k * self.draft_cost + self.costs.cost(1, self.verify_ts[k]))
            if r > rate:
                best, rate = k, r
        self.plain_run = self.plain_run + 1 if best == 0 else 0
        return self.ks[0] if self.plain_run > self.probe else best

    def update(self, proposed: int, accepted: int, draft_s: float) -> None:
        if proposed:
            self.acc = self.decay * self.acc + accepted
            self.tries = self.decay * self.tries + accepted + (accepted < proposed)
            per = draft_s / proposed
            self.draft_cost = per if self.draft_cost is None else 0.8 * self.draft_cost + 0.2 * per
            self.plain_run = 0


@dataclass
class Step:
    """What one target call did: the tokens emitted, the rows committed, drafts proposed, its T and times."""
    emitted: list
    rows: list  # rows of new_kv to commit (the accepted path, root included)
    new_kv: object
    proposed: int
    T: int
    verify_s: float
    draft_s: float = 0.0


def chain_step(target: Backend, cache, drafter, tokens: list[int], k: int, verify_ts: dict, pick: Picker) -> Step:
    """Propose up to k tokens (none when k = 0 or no drafter), verify [last, d1..dk] in the smallest profile
    that holds them (pad rows never committed), accept."""
    N = len(tokens)
    prop = drafter.propose(tokens, k, pick.draft) if drafter is not None and k > 0 else None
    props, qs = (prop.tokens, prop.qs) if prop else ([], [])
    T = 1 if not props else next(t for t in sorted(verify_ts.values()) if t >= len(props) + 1)
    out = target.step(cache, [tokens[-1]] + props + [0] * (T - 1 - len(props)), N - 1)
    check_finite(out.logits[:len(props) + 1], "target")
    emitted = accept(out.logits, props, qs, N, pick)
    if props:
        drafter.accepted(N, len(emitted) - 1, len(props))
    return Step(emitted, list(range(len(emitted))), out.new_kv, len(props), T, out.run_s,
                prop.seconds if prop else 0.0)


def tree_step(target: Backend, cache, drafter: TreeDrafter, tokens: list[int], nodes: int, room: int,
              ts: list[int], costs: StepCosts, pick: Picker) -> Step:
    """Draft a tree of at most nodes + 1 nodes, verify its first T nodes in one call -- the profile T with the
    most expected tokens per second of target time, (1 + the first T-1 node scores) / cost(T) -- accept
    along the tree, let the drafter learn from the call."""
    N = len(tokens)
    t = drafter.draft(tokens, nodes, room)
    # `room` bounds the tree's depth, not its nodes, and every node takes a cache slot for the call: near the
    # capacity only the T that fit (a 32-token prompt of a 96-slot bundle, 60 tokens in, drew T = 5)
    ts = [T for T in ts if N - 1 + T <= target.capacity] or [1]
    cum = np.concatenate([[1.0], 1.0 + np.cumsum(t.score[1:])])
    T = costs.best(1, ts, lambda T: cum[min(T, len(t)) - 1])
    ids, pos, mask = t.inputs(T, N)
    out = target.step(cache, ids, N - 1, new_mask=mask, positions=pos)
    n = min(T, len(t))
    check_finite(out.logits[:n], "target")
    emitted, rows = accept_tree(out.logits, t, T, N, pick)
    drafter.verified(t, rows, emitted, out.logits[:n], out.top)
    return Step(emitted, rows, out.new_kv, n - 1, T, out.run_s)


def generate(target: Backend, drafter, prompt: list[int], cfg: DecodeConfig, stats: Stats) -> Iterator[list[int]]:
    """Yield the tokens accepted at each step (at most cfg.max_new_tokens in all). Stops on max tokens only;
    the caller stops on EOS and stop strings by closing the generator. `drafter`: a ChainDrafter
    (ModelDrafter, NgramDrafter), a TreeDrafter (RecycleDrafter) or None (plain decoding)."""
    t0 = time.perf_counter()
    verify_ts = {k: target.entry.profiles[f"verify_{k}"] for k in target.entry.verify_ks()}
    pick = Picker(cfg.sampling)
    tree = isinstance(drafter, TreeDrafter)
    stats.prompt_tokens = len(prompt)
    stats.hist = [0] * (cfg.k + 1)
    cache = target.new_cache()
    # room for the whole generation now: one allocation instead of a copy per bucket on the way
    cache.reserve(len(prompt) + cfg.max_new_tokens + max(verify_ts.values(), default=1))
    # the first token comes from the prefill's last row (one target call fewer than feeding the last prompt
    # token in a decode step); the other prompt rows get no logits, so the recycle drafter does not learn from
    # the prompt (it would cost ~17% more prefill for ~1% more tokens per step: docs/benchmarks.md)
    logits, stats.prefill_s = feed(target, cache, prompt)
    check_finite(logits[None], "target")
    if drafter is not None and not tree:
        stats.prefill_s += drafter.start(prompt, cache)
    tokens = list(prompt) + [pick.target(logits, len(prompt))]
    stats.new_tokens = 1
    stats.total_s = time.perf_counter() - t0
    yield tokens[-1:]
    costs = StepCosts()
    policy = (KPolicy(sorted(verify_ts), verify_ts, costs, allow_plain=isinstance(drafter, NgramDrafter))
              if cfg.adaptive and drafter is not None and not tree else None)
    tree_ts = [1] + [T for k, T in verify_ts.items() if k <= cfg.k]
    while stats.new_tokens < cfg.max_new_tokens:
        room = cfg.max_new_tokens - stats.new_tokens - 1  # drafts beyond this could not be emitted
        if tree:
            st = tree_step(target, cache, drafter, tokens, cfg.k, room, tree_ts, costs, pick)
        else:
            k = min(policy.choose() if policy else cfg.k, room)
            st = chain_step(target, cache, drafter, tokens, k, verify_ts, pick)
        a = len(st.emitted) - 1
        cache.commit(st.new_kv, st.rows)
        costs.update(1, st.T, st.verify_s)
        if policy is not None:
            policy.update(st.proposed, a, st.draft_s)
        tokens += st.emitted
        stats.steps += 1
        stats.proposed += st.proposed
        stats.accepted += a
        stats.hist[a] += 1
        stats.verify_s += st.verify_s
        stats.draft_s += st.draft_s
        stats.new_tokens += len(st.emitted)
        stats.total_s = time.perf_counter() - t0
        yield st.emitted
