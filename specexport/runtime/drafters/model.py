"""The draft-model drafter: a draft model of the bundle (separate checkpoint, early-exit slice, int4/int8
copy) with its own KV ring buffer; it catches up on the tokens it has not seen, then proposes k. A self-draft
with the target's KV layout (an int4/int8 copy) reads the target's cache instead (kv.SharedKV): no prefill
and no cache of its own. In the batching engine a draft model drafts for every request at once instead
(PoolDrafts: shared calls over a KV pool of its own, one row per request, or the target's pool for such a
self-draft).
"""
from __future__ import annotations

import bisect
import math

import numpy as np

from ...backends.base import Backend
from ..costs import StepCosts
from ..kv import KVPool, RingKV, SharedKV, SharedPool
from ..prefill import feed
from ..sampling import logsumexp
from .base import Choose, Proposal
from .ngram import NgramDrafter
from .recycle import SuccessorTable


def shares_pool(target: Backend, draft: Backend) -> bool:
    """Can `draft` read the target's KV pool in the batching engine: shares_cache, the same pool layout
    (fixed or bucketed) and B-row calls of every batch size the target runs."""
    return (shares_cache(target, draft) and draft.fixed_pool == target.fixed_pool
            and all(draft.runs_batch(b) for b in target.batch_sizes))


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


class Doubt:
    """How likely the target is to accept a draft model's proposal, learned from its verified proposals: (accepted,
    tried) counts per cell of two signals the draft gives with each one, its probability and its margin over its
    runner-up (the two bins' edges below). Which signal tells depends on the draft: teacher-forced on the target's
    greedy output (13 Spec-Bench questions, experiments/draft_confidence.py, 2026-12-07 `epyc-zen4`) the int4
    self-draft's proposals agreed 39 / 66 / 82 / 89 / 100% by probability (< 0.3, < 0.5, < 0.7, < 0.9, above) and
    35-93% by margin, the int8 self-draft's 86 / 95 / 99 / 100 / 100% by probability, so a cut at one probability
    stopped it where it was still right six times in seven, and 73% below a margin of 0.05, 94% at 0.05-0.1, at
    least 99% above 0.1: its proposals miss only where the target's top two are close. A cell starts at its
    probability bin's middle, worth PRIOR tries, and the counts then follow what the target accepted: replayed on
    those questions one after another as a fresh engine learns them (the one-row rule of `Engine._model_drafts`),
    a prior of 2 / 1 / 0.5 tries made 132.8 / 134.2 / 135.2 tokens/s with the int8 self-draft, 102.6 / 102.6 /
    102.4 with the int4, and the chances fitted on all of them beforehand 136.6 / 103.4."""

    P_EDGES = (0.3, 0.5, 0.7, 0.9)
    M_EDGES = (0.05, 0.1, 0.2, 0.4)
    PRIOR = 1.0

    def __init__(self):
        mid = np.array([0.15, 0.4, 0.6, 0.8, 0.95])
        self.tries = np.full((len(self.P_EDGES) + 1, len(self.M_EDGES) + 1), self.PRIOR)
        self.hits = self.tries * mid[:, None]

    def cell(self, logits: np.ndarray, t: int) -> tuple[int, int]:
        """The cell of proposal t under a row of logits (softmax by sampling.logsumexp in the logits' float32:
        one pass over SmolLM2's 49,152 logits takes ~43 us, ~234 us in float64; the runner-up is the larger of
        two slices' maxima, ~3 us, where np.partition takes ~270 us; 2026-12-07, `epyc-zen4`)."""
        lse = logsumexp(logits)
        other = max(float(logits[:t].max(initial=-np.inf)), float(logits[t + 1:].max(initial=-np.inf)))
        p = math.exp(float(logits[t]) - lse)
        return bisect.bisect(self.P_EDGES, p), bisect.bisect(self.M_EDGES, p - math.exp(other - lse))

    def chance(self, cell: tuple[int, int]) -> float:
        return float(self.hits[cell] / self.tries[cell])

    def record(self, cells: list, a: int, verified: int) -> None:
        """A chain whose first `verified` proposals (cells) were verified, a of them accepted: each accepted one
        and the first missed one were tried; those after a miss were not judged."""
        for i, c in enumerate(cells[:min(verified, a + 1)]):
            self.tries[c] += 1
            self.hits[c] += i < a


class RowDraft:
    """One request's draft-model proposals in the batching engine: made for every such request at once by
    `PoolDrafts.run` before the step's target call, read by the engine as a chain (`propose`)."""

    def __init__(self):
        self.props: list = []
        self.screened = False  # this step's drafts were made under the doubt rule (PoolDrafts.run's bars)
        self.cells: list = []  # then each proposal's Doubt cell
        self.chance = 1.0  # and the product of their chances

    def propose(self, tokens: list[int], k: int, choose: Choose | None = None) -> Proposal:
        return Proposal(self.props[:k], [None] * min(k, len(self.props)))


class PoolDrafts:
    """The draft model for the batching engine. Its KV pool's row r holds the draft's cache of the request on
    the target pool's row r (reset at admission, moved with it). Every call feeds each drafting row one
    token (T = 1: a fused graph's B-row calls take no more), its next token not yet in the draft's cache or
    its latest proposal, so rows catching up on the tokens the target accepted and rows already proposing
    share the calls: a step of k drafts costs k + (catch-up - 1) B-row draft calls, not k per request. A row
    further behind (a new request's prompt, or steps that did not draft) first catches up alone in prefill
    chunks. A proposal is the draft's argmax, or its Gumbel-max with the request's own noise when sampling
    with "gumbel": a point mass, which the target's acceptance (runtime/accept) keeps lossless whatever it is.

    With `target_pool` (a self-draft that shares_pool with the target) the draft reads the target's pool
    (kv.SharedPool): every row starts each step at the target's committed length, one token behind (the
    request's last), so nothing is prefilled or caught up, and its proposals' K/V go into free slots that the
    target's verify call overwrites; every row of a draft call writes only past its target length.
    Without it, the draft keeps a cache of its own per request: a 135M int4 self-draft that did so on the
    engine reached 1.28x plain decoding at one request against 1.52-1.62x solo, where it shares the cache."""

    CATCHUP = 2  # tokens a row may be behind and still catch up in the shared calls
    STAGE_ROWS = 4  # guesses only in draft calls of at most this many rows
    STAGE_MAX = 3  # at most this many guesses a row
    # a guess's kind -> its chance of being the draft's next proposal before any is counted, worth GUESS_PRIOR tries:
    # as measured with SmolLM2's int8 self-draft, 16 Spec-Bench prompts at one request (2026-12-07, `epyc-zen4`)
    GUESS_CHANCES = {("lookup", 1): 0.23, ("lookup", 2): 0.5, ("lookup", 3): 0.78,
                     ("table", 1): 0.18, ("table", 2): 0.27, ("table", 3): 0.47}
    GUESS_PRIOR = 4

    def __init__(self, model: Backend, rows: int, target_pool: KVPool | None = None, table=None):
        self.model = model
        self.shared = target_pool is not None
        self.pool = SharedPool(target_pool) if self.shared else model.new_pool(rows)
        self.calls: dict = {}  # B -> draft calls of B rows (Engine.stats "draft_batch")
        self.costs = StepCosts()  # seconds of the draft's calls, by (B, T)
        self.doubt = Doubt()
        # the guesses fed after a row's latest token: prompt lookup, else the draft's own successors (its top ids
        # after the latest 1-3 tokens, learnt from its calls, starting from the bundle's seeded table if any)
        self.stage = True
        self.ratio: dict = {}  # B -> `token_cost`'s share of a (B, 1) call (a moving average, weight 0.1)
        self.lookup = NgramDrafter(3)
        self.forget(table if table is not None else SuccessorTable(model.vocab))

    def forget(self, table) -> None:
        """Guess from `table` (the draft's successors) and the kinds' prior chances, as a new engine does."""
        self.table = table
        self.hits = {k: p * self.GUESS_PRIOR for k, p in self.GUESS_CHANCES.items()}  # kind -> guesses it hit
        self.tries = dict.fromkeys(self.GUESS_CHANCES, float(self.GUESS_PRIOR))  # and it made

    def reset(self, r: int) -> None:
        self.pool.n[r] = self.pool.target.n[r] if self.shared else 0

    def move(self, src: int, dst: int) -> None:
        """The request on row src moved to row dst of the target's pool: its draft cache follows (the draft
        pool's rows mirror the target's, so its own free list is not used; a shared pool moved with it)."""
        self.pool.copy_row(src, dst)
        self.reset(src)

    def run(self, want: list, bars: dict | None = None) -> float:
        """want: (request, k) pairs (a request: .row, .ids, .pick, .drafter a RowDraft) -> seconds inside the
        draft model; each request's drafter.props gets its k proposals, or fewer for a k="auto" request whose
        row has a bar: its drafting stops once the chance that all its proposals are accepted (the product of
        their Doubt chances) is no more than the bar (at the first proposal after it that its call did not score
        already: see `_take`). A call may feed a proposing row guesses of its next
        proposals after its latest (`_guesses`, `_stage`): the draft's proposals stay what one-token calls make,
        and each guess it agrees with saves the call that would have fed that proposal."""
        bars = bars or {}
        pool, spent, queue = self.pool, 0.0, {}
        if self.shared:  # every row from the target's committed length; the others' writes land past it too
            pool.sync()
        for s, k in want:
            s.drafter.props, s.drafter.cells, s.drafter.screened = [], [], s.cfg.adaptive and s.row in bars
            s.drafter.chance = 1.0
            todo = s.ids[int(pool.n[s.row]):]  # never empty: the last token is fed with the drafts
            if len(todo) > self.CATCHUP:
                spent += feed(self.model, pool.row(s.row), todo[:-1])[1]
                todo = todo[-1:]
            queue[s.row] = (s, list(todo), k)
        B0, calls_s = self.model.batch_for(max(queue) + 1) if queue else 0, 0.0
        while queue:
            B = self.model.batch_for(max(queue) + 1)
            cand = self._guesses(queue, B)
            m = self._stage(queue, cand, B)
            fed = {r: [todo[0]] + [x[0] for x in cand.get(r, [])[:m]] for r, (_, todo, _) in queue.items()}
            T = max(map(len, fed.values()))
            ids = np.zeros((B, T), dtype=np.int64)
            for r, f in fed.items():
                ids[r, :len(f)] = f
            # pad rows at their own n; every row's T slots past its n are free (the drafts' or never committed)
            out = self.model.step_batch(pool, ids, pool.n[:B].astype(np.int64)[:, None] + np.arange(T)[None])
            spent += out.run_s
            calls_s += out.run_s
            self.calls[B] = self.calls.get(B, 0) + 1
            self.costs.update(B, T, out.run_s)
            seen = []  # (context, the draft's top ids after it): what `_guesses` reads next time
            for r, (s, todo, k) in list(queue.items()):
                used, done = self._take(s, todo, k, fed[r][1:], cand.get(r, []), out, r, bars, seen)
                pool.commit(r, out.new_kv, r, list(range(used)))
                if done:
                    del queue[r]
            if seen and out.top is not None and out.top.shape[-1] >= self.table.width:
                self.table.observe([c for c, _ in seen], None, np.array([t for _, t in seen]))
        most = max((len(s.drafter.props) for s, _ in want), default=0)
        if most and B0 <= self.STAGE_ROWS:  # the calls' seconds per proposal of the longest chain, to one call's
            r = calls_s / most / self.costs.cost(B0, 1)
            self.ratio[B0] = r if B0 not in self.ratio else 0.9 * self.ratio[B0] + 0.1 * r
        return spent

    def token_cost(self, B: int) -> float:
        """Seconds of drafting a proposal for each of B rows: a (B, 1) call, times what the guesses saved of such
        calls at B lately (the calls' seconds per proposal of a step's longest chain, to a (B, 1) call's)."""
        return self.costs.cost(B, 1) * min(self.ratio.get(B, 1.0), 1.0)

    def _take(self, s, todo, k, fed, cand, out, r, bars, seen) -> tuple[int, bool]:
        """Row r of a draft call for request s, fed todo[0] then the guesses `fed`: its proposals, one per
        logits row while each proposal equals the guess fed after it -> (rows whose K/V to keep, done). cand:
        the guesses made for it (fed or not); their first and every fed one count towards their kind's `chance`."""
        d, c, doubted = s.drafter, 0, False
        while True:
            todo.pop(0)
            c += 1
            if todo:  # still catching up: no proposal from this row yet
                return c, False
            sp, pos = s.pick.sp, len(s.ids) + len(d.props)
            logits = out.logits[r, c - 1]
            t = s.pick.target(logits, pos) if sp.greedy or sp.sampler == "gumbel" else int(np.argmax(logits))
            if out.top is not None:
                seen.append((tuple((s.ids[-3:] + d.props)[-3:]), out.top[r, c - 1]))
            if c - 1 < len(fed) or (c == 1 and cand):  # a guess for this position (fed, or the first): its kind learns
                guess, kind, _ = cand[c - 1]
                self.tries[kind] += 1
                self.hits[kind] += guess == t
            d.props.append(t)
            if d.screened:
                d.cells.append(self.doubt.cell(logits, t))
                d.chance *= self.doubt.chance(d.cells[-1])
                doubted = doubted or d.chance <= bars[r]
            todo.append(t)
            if len(d.props) >= k:
                return c, True
            # t was fed after this row (its guess): the call scored the next proposal too, so a row past its bar
            # takes it as well, as no draft call pays for it; else the next call feeds t, unless past the bar
            if c > len(fed) or fed[c - 1] != t:
                return c, doubted

    def _guesses(self, queue: dict, B: int) -> dict:
        """row -> up to STAGE_MAX (token, kind, chance) guesses of the draft's next proposals after a proposing
        row's latest token, each from the kind with the best hit rate so far (`_guess`); none for calls over more
        than STAGE_ROWS rows."""
        if B > self.STAGE_ROWS or not self.stage:
            return {}
        out = {}
        for r, (s, todo, k) in queue.items():
            if len(todo) != 1 or k - len(s.drafter.props) < 2:
                continue
            seq, g = s.ids + s.drafter.props, []  # a new list: the guesses are appended to it
            for _ in range(min(self.STAGE_MAX, k - len(s.drafter.props) - 1)):
                x = self._guess(seq)
                if x is None:
                    break
                g.append(x)
                seq.append(x[0])
            if g:
                out[r] = g
        return out

    def _guess(self, seq: list):
        """(token, kind, chance) that follows seq: the continuation of its latest longest earlier match of 1-3
        tokens (prompt lookup, kind ("lookup", n)), or the draft's own most likely successor of its last 1-3
        tokens (`table`, kind ("table", order)), whichever kind has hit more often; None if neither has one."""
        best = None
        n, e = self.lookup.match(seq)
        if n:
            best = (int(seq[e + 1]), ("lookup", n))
        c = self.table.candidates(tuple(seq[-3:]), 1)
        if c:
            kind = ("table", c[0][0] // self.table.width + 1)
            if best is None or self.chance(kind) > self.chance(best[1]):
                best = (c[0][1], kind)
        return None if best is None else (best[0], best[1], self.chance(best[1]))

    def chance(self, kind) -> float:
        return self.hits[kind] / self.tries[kind]

    def call_ts(self, B: int) -> list[int]:
        """The T of the draft's calls over B rows: 1, and with 1..STAGE_MAX guesses where B <= STAGE_ROWS (those the
        model runs: any T on specexport's kernels, else its profiles')."""
        more = range(2, self.STAGE_MAX + 2) if self.stage and B <= self.STAGE_ROWS else ()
        return [1] + [T for T in more if self.model.any_t or T in self.model.batch_ts(B)]

    def _stage(self, queue: dict, cand: dict, B: int) -> int:
        """How many guesses this call feeds each row: the m that maximises the proposals it is expected to
        make, each row's 1 + c1 + c1 c2 + ... (c: its guesses' chances; m at most its guesses and the proposals
        it still needs - 1), per second of the (B, m + 1) call (measured; priced as in StepCosts before)."""
        if not cand:
            return 0
        room = self.pool.buckets[-1] - int(self.pool.n[:B].max())
        lens = {r: k - len(s.drafter.props) - 1 for r, (s, _, k) in queue.items()}
        cums = {r: np.cumprod([x[2] for x in g]) for r, g in cand.items()}
        best, top = 0, 0.0
        for T in self.call_ts(B):
            m = T - 1
            if T > room:
                break
            e = len(queue) + sum(float(c[:min(m, lens[r])].sum()) for r, c in cums.items())
            v = e / self.costs.cost(B, m + 1)
            if v > top:
                best, top = m, v
        return best

    def accepted(self, s, a: int, verified: int) -> None:
        """Request s (before its emitted tokens are appended) accepted a of the first `verified` of its
        proposals: keep the draft's K/V of its tokens and of the accepted proposals it was fed (all but the last
        proposal were); a screened chain's cells learn what the target accepted."""
        kd = len(s.drafter.props)
        if s.drafter.screened:
            self.doubt.record(s.drafter.cells, a, verified)
        if kd and not self.shared:  # a shared pool starts from the target's length at every step
            self.pool.n[s.row] = min(int(self.pool.n[s.row]), len(s.ids) + min(a, kd - 1))
