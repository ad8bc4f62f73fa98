"""The request engine: many requests on one loaded Pipeline, each a stream of text pieces.

`Pipeline.submit(prompt, ...)` -> Completion: validated before anything is queued (bad options and prompts
that cannot fit raise at submit), queued up to a bound (QueueFull past it), then run. A Completion is
iterated for text pieces from any thread, cancelled from any thread, and carries its Generation
(text, token ids, finish_reason, stats) as it goes.

finish_reason: "eos" | "stop" (a stop string) | "length" | "cancelled" | "error" (then .error holds it).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from ..errors import EngineClosed, OptionError, QueueFull
from .costs import Payoff, StepCosts, chain_slope, chain_tokens
from .accept import Picker, accept_tree, check_finite
from ..backends.base import StepOut
from .decoder import DecodeConfig
from .drafters import PoolDrafts, RecycleDrafter, RowDraft, Tree, shares_pool
from .prefill import ALONE_CHUNK, chunk_ts, feed, feed_chunk, next_chunk
from .prefix import PrefixCache, exact as prefix_exact
from .text import TextStream

_DONE = object()
log = logging.getLogger("specexport")
# default prefill budget per iteration while others decode: one prefill chunk per request still prefilling,
# at most PREFILL_CHUNKS_MAX chunks. One chunk keeps the decoding requests' inter-token time within one chunk
# call when a request arrives alone; when several prefill at once (arrivals spread out, a service under load)
# the step takes more of their prompts (docs/benchmarks.md: a fixed 256 lost in a burst, this won under Poisson)
PREFILL_CHUNKS_MAX = 4
ADMIT_GAP_S, ADMIT_MAX_S = 0.010, 0.050  # how an idle engine collects a burst before its first step
# a request moves to a lower pool row (one copy of its cache) only with this many tokens still to go: one
# row fewer in a call saves ~1.5 ms per step on SmolLM2, the copy of a few hundred cached tokens costs ~2 ms
MOVE_MIN_LEFT = 4
# a chain's running acceptance (ngram, draft model) is measured only on steps that verify it; a step that
# offered a chain and verified none of it (its rate priced it out) pulls the rate this far towards the prior,
# so that a request whose drafts missed for a while tries them again later instead of never. The prior is the
# acceptance of that drafter's chains over every request's verified steps (Engine.chains; 0.5 before any): a
# request starts from it, worth two tried tokens. From 0.5 instead, requests admitted while 4 others decoded
# (k = "auto", the int4 self-draft, whose chains were accepted at ~0.8) were priced out before their first
# draft and never measured: k = 0 on 246 of a burst's 4-row steps, 0.93x fixed k = 4 (2026-12-05, xeon-m207)
CHAIN_PRIOR_PULL = 0.05
CHAIN_PRIOR_START = (1.0, 2.0)  # a drafter's pooled (hits, tries) before any verified chain: 0.5
# the weight of a chain's past steps in its running acceptance, per verified step: 0.8 followed the misses
# so closely that one request's self-draft went to k = 2 on a quarter of its steps and made 0.95x fixed k = 4;
# 0.95: 1.01x it, 1.06x the 0.8 (13 Spec-Bench prompts one at a time, medians of 3 interleaved rounds, 2026-12-05)
CHAIN_DECAY = 0.95
# at up to this many rows a k="auto" draft model drafts up to CONFIDENT_K tokens (at least what `_model_k` chose),
# each request stopping where one more proposal is not expected to pay for its draft call (`_model_drafts`):
# replayed on 13 Spec-Bench questions with the engine's call costs, the int8 self-draft made 136.6 tokens/s
# drafting up to 8 and 126.3 up to 4, the int4 103.4 / 102.5 (experiments/draft_confidence.py, 2026-12-07
# `epyc-zen4`); at 2 rows a cut by Doubt (then at a chance of 0.8) made 0.82x fixed k = 4 with the int8 self-draft
# (experiments/guard_ab.py --variants rows-2, 08:38): a (2, 9) verify takes two passes over the weights, a (1, 9) one
CONFIDENT_ROWS, CONFIDENT_K = 1, 8


# the rate fit's weight of its past steps per verified step (~50 steps' memory), and the steps it needs before use
RATE_FIT_DECAY, RATE_FIT_STEPS = 0.98, 8
RATE_FIT_MAX = 0.15  # the largest offset the rate fit applies, either way
WARM_CALLS = 2  # measured calls per shape at warm-up, after the first (`_warm_cost`)
# the cache length the warm-up's decode, verify and draft calls run at where the pool is fixed (fused graphs read
# each row's own n slots): a decode row reads its whole cache, ~0.9 ms a row at 300 cached tokens for SmolLM2 on
# an AVX2-only CPU, so calls warmed at n = 0 priced the shapes no request had run yet (the verify calls at B > 1,
# the draft's B-row calls) 15-35% below what they cost at 300, while the plain calls' prices followed the
# requests' lengths (2026-12-06, `epyc-zen3`); Spec-Bench's prompts average 190 tokens, plus the decode so far
WARM_CACHED = 256


def _warm_length(pool, span: int) -> int:
    """The cached length a warm-up call of up to `span` new tokens runs at on `pool`: WARM_CACHED within its
    capacity where the pool is fixed, else 0 (a bucketed pool would grow for it)."""
    return min(WARM_CACHED, pool.buckets[-1] - span) if pool.fixed else 0
# a B priced out of drafting (`_model_k` 0) drafts again after this many such steps, so that the prices and rates
# that priced it out are measured anew; each retry that is priced out again doubles the wait (at most 2 ** 4 x).
# Prices are moving averages of the calls that ran: a slow spell in the draft's 4-row calls (4.1 -> 7.5 ms against
# ~4.5 ms steady) and a stretch of misses priced 4 rows out of drafting on 167 of a burst's 229 steps, and
# with no drafts nothing measured them again (2026-12-06, `xeon-m207`, the first burst on a fresh engine)
PROBE_STEPS, PROBE_DOUBLINGS = 8, 4
# ... and, where the prices put drafting far below plain, after more steps: a retry loses the gap times its own
# length, (1 - drafting's / plain's tokens per second) * (its call and draft calls) / (a plain call), in plain
# steps (at 8 rows on an AVX2-only CPU a k = 2 step took ~110 ms, 3.1 plain steps, and delivered ~0.75x plain's
# tokens per second: ~0.8 plain steps lost per retry), so the first wait is that loss over PROBE_LOSS when that
# is longer: the retries then cost about PROBE_LOSS of the steps. The wait counts the steps priced out at any B of
# one built batch size (5..8 of --batch 4,8 is one): a burst's tail decodes at 8, 7, 6 rows in turn, and waits
# kept per B retried at each (2026-12-06, `epyc-zen3`)
PROBE_LOSS = 0.01
# the choice of k at a B leaves the k it chose last there only for one expected to deliver this much more per
# second: at 4 rows the expectations of k = 2 and k = 4 were within a few percent of each other on most steps,
# and the choice flipped between them on the rates' noise
K_MARGIN = 0.03


def _warm_cost(call) -> float:
    """Seconds of a call shape for the cost table before any request ran it: the cheapest of WARM_CALLS calls
    after the first (which pays for the shape's buffers). A shape is priced again only when a step chooses it,
    so one priced too high is never tried: from one call, the (4, 3) verify of SmolLM2 measured 32 ms at one
    warm-up and 24 ms at another, and the one where it cost 32 never chose T = 3 (2026-12-05, `xeon-m207`);
    noise on a shared machine only adds time."""
    call()
    return min(call().run_s for _ in range(WARM_CALLS))


def _decayed(hits: float, tries: float, a: int, missed: bool) -> tuple:
    """A chain's running sums after a verified step that accepted a drafted tokens (and tried one more, which
    missed, when `missed`), the earlier steps weighted CHAIN_DECAY."""
    return CHAIN_DECAY * hits + a, CHAIN_DECAY * tries + a + missed


class Completion:
    """One submitted request. Iterate for text pieces (blocks until each is ready); `generation` fills as it
    goes; `cancel()` ends it at the next step and frees its place."""

    def __init__(self, generation):
        self.generation = generation
        self.error: BaseException | None = None
        self._pieces: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._done = threading.Event()

    # ---- consumer side
    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._pieces.get()
            if piece is _DONE:
                return
            yield piece

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        """Block until finished -> its Generation (finish_reason set); TimeoutError if it is not done in time."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request did not finish within {timeout} s")
        return self.generation

    # ---- engine side
    def _put(self, piece: str) -> None:
        self._pieces.put(piece)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if self._done.is_set():
            return
        self.generation.finish_reason = reason
        self.error = error
        self._done.set()
        self._pieces.put(_DONE)


@dataclass
class Sequence:
    """One request inside the engine: its tokens so far, its pool row, drafter, sampler and text."""
    c: Completion
    ids: list  # prompt + emitted tokens
    cfg: DecodeConfig
    text: TextStream
    drafter: object = None  # RecycleDrafter | NgramDrafter | RowDraft (the engine's draft model) | None
    pick: Picker | None = None
    row: int = -1
    cache: object = None  # the row as a RingKV (prefill chunks)
    fed: int = 0  # prompt tokens already in the cache
    chain_hits: float = 1.0  # a chain's running sums: drafted tokens accepted, and tokens tried (prior: 1 of 2)
    chain_tries: float = 2.0
    emitted: int = 0
    t0: float = field(default_factory=time.perf_counter)

    @property
    def chain_rate(self) -> float:
        """The running per-token acceptance of a chain (ngram, model; node scores: rate ** depth)."""
        return self.chain_hits / self.chain_tries

    @property
    def prefilled(self) -> bool:
        return self.fed >= self.c.generation.stats.prompt_tokens


class Engine:
    """Continuous batching of speculative decoding on one target model (torch-free).

    One loop (its own thread, or `step()` called by hand) that, per iteration:
      1. admits waiting requests into free pool rows (at most `max_batch` run at once, `max_queue` wait);
      2. runs prefill chunks of admitted requests, at most `prefill_budget` tokens per iteration (default
         one chunk per request still prefilling, at most PREFILL_CHUNKS_MAX chunks; no limit while nothing
         decodes), so a long prompt interleaves with everyone else's decode
         steps instead of stalling them; first chunks of requests on neighbouring rows run as one call, and
         the requests it completed decode at the next step before any other chunk runs;
      3. lets every decoding request draft its own tree (recycle), chain (ngram) or nothing (none), pads
         them to one (B, T) call over the rows [0, B) they need and runs ONE target call for all of them;
      4. accepts per row (greedy, Gumbel, rejection: runtime/accept), commits per row (a row that accepts
         a drafts commits its a+1 path rows; the rest are never committed), streams, retires finished and
         cancelled requests (their rows are free for the next iteration).
    T per step: with k="auto" the T of the built profiles that maximises the batch's expected emitted
    tokens per second, sum over rows of (1 + the row's first T-1 node scores) / measured cost of (B, T)
    (runtime/costs); with a fixed k, the smallest profile that holds every row's k+1 nodes."""

    def __init__(self, target, make_sequence, max_batch: int = 4, max_queue: int = 64,
                 prefill_budget: int | None = None, draft=None, prefix_cache: int = 0, successors=None):
        if not (isinstance(max_batch, int) and not isinstance(max_batch, bool) and max_batch >= 1):
            raise OptionError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not (isinstance(max_queue, int) and not isinstance(max_queue, bool) and max_queue >= 0):
            raise OptionError(f"max_queue must be an integer >= 0, got {max_queue!r}")
        built = [b for b in target.batch_sizes]
        if max_batch > built[-1]:
            raise OptionError(f"max_batch={max_batch} exceeds the bundle's largest batch size {built[-1]} "
                              f"(built: {built}): lower it or rebuild with --batch including {max_batch}")
        self.target, self.make_sequence = target, make_sequence
        self.max_batch, self.max_queue = max_batch, max_queue
        self.batch_sizes = [b for b in built if b <= max_batch] or [1]
        if self.batch_sizes[-1] < max_batch:
            self.batch_sizes.append(next(b for b in built if b >= max_batch))
        self.chunk = target.entry.profiles.get("prefill", 1)
        self.fixed_budget = prefill_budget  # None: the default, which follows how many requests prefill
        self.budget_max = prefill_budget or PREFILL_CHUNKS_MAX * self.chunk
        self.prefill_budget = prefill_budget or self.chunk  # this iteration's (step() sets the default's)
        self.pool = target.new_pool(self.batch_sizes[-1])
        # prompts' K/V kept for later requests within `prefix_cache` bytes (runtime/prefix.py): host pools, and only
        # where a copied prefix gives the bits of a whole prefill (checked now: a few prefill calls)
        self.prefixes = None
        if prefix_cache and isinstance(self.pool.data, np.ndarray):
            if prefix_exact(target, self.chunk):
                self.prefixes = PrefixCache(prefix_cache, self.pool.data[:, :, 0])
            else:
                log.info("specexport: no prefix cache on this target: a prompt prefilled in parts rounds apart "
                         "from one prefilled whole here, so reusing a prefix would not be lossless")
        # the bundle's draft model (a backend with step_batch), for requests with draft="model": its own pool,
        # or the target's for a self-draft with the target's KV layout
        self.drafts = None if draft is None else PoolDrafts(draft, self.pool.rows,
                                                            self.pool if shares_pool(target, draft) else None,
                                                            successors)
        self.costs = StepCosts()
        # a mixed graph (fused targets): its single-sequence groups carry a prefill chunk beside the decode rows,
        # or let up to groups + 1 requests verify their own drafts in one call; pair_costs prices those calls by
        # (requests, T)
        self.groups = getattr(target, "groups", 0)
        self.pair_costs = StepCosts()
        self.payoff = Payoff()  # whether speculating still pays, per batch size >= 3 (adaptive requests only)
        self.chains: dict = {}  # chain drafter's type -> (hits, tries) over every request's verified chains
        # chain drafter's type -> decayed sums over its verified chains of the tokens they emitted, of what the
        # geometric law at each request's running rate expected of them, of the law's slope there, and the steps
        self.rate_fit: dict = {}
        # built batch size -> [steps priced out at its Bs since the last retry, retries priced out in a row]
        self.priced_out: dict = {}
        self.last_T: dict = {}  # B -> the T that `_model_k` chose last at B
        self.spec_rate = 0.0  # the tokens per second a row of `_model_k`'s latest choice was expected to emit
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: deque = deque()
        self._active: list[Sequence] = []  # admitted: prefilling or decoding
        self._closed = False
        self._thread: threading.Thread | None = None
        self.counters = {"steps": 0, "tokens": 0, "finished": {}, "batch": {}, "prefill_batch": {}}

    # ---- any thread
    def submit(self, c: Completion) -> Completion:
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is shutting down and takes no new requests")
            self._drop_cancelled()
            free = max(self.max_batch - len(self._active), 0)  # rows the loop is about to give to waiting ones
            if len(self._waiting) >= self.max_queue + free:
                raise QueueFull(f"{len(self._active)} requests running and {len(self._waiting)} waiting "
                                f"(max_queue={self.max_queue}): try again later")
            self._waiting.append(c)
            self._wake.notify()
        if self._thread is None:
            self.start()
        return c

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="specexport-engine", daemon=True)
                self._thread.start()

    def stats(self) -> dict:
        with self._lock:
            decoding = sum(s.prefilled for s in self._active)
            return {"running": len(self._active), "decoding": decoding, "queued": len(self._waiting),
                    "max_batch": self.max_batch, "max_queue": self.max_queue, "steps": self.counters["steps"],
                    "tokens": self.counters["tokens"], "finished": dict(self.counters["finished"]),
                    "batch": dict(self.counters["batch"]), "prefill_batch": dict(self.counters["prefill_batch"]),
                    "mixed_rides": self.counters.get("rides", 0), "mixed_apart": self.counters.get("apart", 0),
                    "batch_verify": self.counters.get("batch_verify", 0),
                    "row_moves": self.counters.get("moves", 0),
                    "draft_batch": dict(self.drafts.calls) if self.drafts is not None else {},
                    "prefill_budget": self.prefill_budget, "pool_slots": self.pool.S,
                    "prefix_cache": self.prefixes.stats() if self.prefixes is not None else None,
                    "pool_bytes": self.pool.resident_bytes, "pool_peak_bytes": self.pool.peak_bytes}

    def close(self, timeout: float | None = None) -> bool:
        """Stop taking requests, cancel the waiting ones, let the running ones finish (up to `timeout` s,
        then cancel them) -> True if everything ended in time."""
        with self._lock:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
            running = [s.c for s in self._active]
            self._wake.notify()
        for c in waiting:
            c._finish("cancelled")
        ok = all(c._done.wait(timeout) for c in running)
        if not ok:
            for c in running:
                c.cancel()
        return ok

    def warm(self) -> float:
        """Run each call shape the loop makes before any request does -> seconds spent. A backend's first call
        of a shape pays for its buffers (onnxruntime grows its arena; in a VM the host maps fresh pages): up to
        ~1 s per shape for SmolLM2 on 2 cores, which would otherwise land on the first requests' time to first
        token and stall everyone decoding (docs/benchmarks.md). Decode and verify shapes run three times and the
        cheaper of their second and third calls seeds the cost table the choice of T reads (`_warm_cost`). The
        calls use free rows and commit nothing (a fused call writes only free slots): decode, verify and draft
        calls at WARM_CACHED cached slots where the pool is fixed (what a request's call reads; elsewhere and
        for prefill chunks n = 0). Where the target
        runs any T (`any_t`), prompts' unpadded remainders make other shapes, each smaller than the largest
        warmed one: their first calls cost what their second do (2026-12-05, `epyc-zen4`: 220 tokens at 1,280
        cached 390 against 380 ms)."""
        t0, tgt, pool = time.perf_counter(), self.target, self.pool
        chunk = tgt.entry.profiles.get("prefill", 1)
        steps = {t for name, t in tgt.entry.profiles.items() if not name.startswith("prefill")}
        span = max(tgt.profile_ts)
        cached = _warm_length(pool, span)
        for B in self.batch_sizes:
            pos = np.broadcast_to(np.arange(span), (B, span))
            pool.n[:] = cached  # every row is free: the calls read `cached` slots of nothing and commit nothing
            for T in [t for t in tgt.batch_ts(B) if t in steps]:
                self.costs.update(B, T, _warm_cost(lambda: tgt.step_batch(pool, np.zeros((B, T), dtype=np.int64),
                                                                          cached + pos[:, :T])))
            pool.n[:] = 0
            if B > 1 and chunk > 1:  # first prefill chunks of neighbouring rows (`_prefill_batch`)
                tgt.step_batch(pool, np.zeros((B, chunk), dtype=np.int64), pos[:, :chunk].copy(), rows=[0])
        row = pool.row(pool.free[0])
        alone = {ALONE_CHUNK} if tgt.any_t and ALONE_CHUNK <= row.buckets[-1] else set()  # prefill with nobody waiting
        for T in sorted({t for name, t in tgt.entry.profiles.items() if name.startswith("prefill")} | alone):
            tgt.step(row, [0] * T, 0, rows=[T - 1])  # single-row chunks (`feed_chunk`)
        if self.drafts is not None:  # the draft's B-row calls (T = 1, and with guesses) and its catch-up chunks
            d, dpool = self.drafts.model, self.drafts.pool
            at = _warm_length(dpool, self.drafts.STAGE_MAX + 1)
            dpool.n[:] = at
            for B in self.batch_sizes:
                for T in self.drafts.call_ts(B):
                    self.drafts.costs.update(B, T, _warm_cost(lambda: d.step_batch(
                        dpool, np.zeros((B, T), dtype=np.int64), np.broadcast_to(at + np.arange(T), (B, T)).copy())))
            dpool.n[:] = 0
            for T in sorted(set(d.entry.profiles.values())):
                d.step(dpool.row(0), [0] * T, 0, rows=[T - 1])
        if self.groups:  # mixed calls: decode rows + a prefill chunk (`_decode`), requests verifying apart
            last = self.batch_sizes[-1] - 1
            for B in self.batch_sizes:
                for T in chunk_ts(tgt, self.budget_max):
                    tgt.step_mixed(pool, np.zeros((B, 1), dtype=np.int64), np.zeros((B, 1), dtype=np.int64), None,
                                   [(last, [0] * T, np.arange(T), None, [])])
            # requests verify apart only where a batched call cannot verify (`_decode`)
            apart = max(tgt.batch_ts(self.batch_sizes[-1])) == 1
            for m in range(2, min(self.groups + 1, last + 1) + 1) if apart else ():
                for T in [t for t in tgt.batch_ts(1) if t in steps and t > 1]:
                    self.pair_costs.update(m, T, _warm_cost(lambda: tgt.step_mixed(
                        pool, np.zeros((1, T), dtype=np.int64), pos[:1, :T].copy(), None,
                        [(j, [0] * T, np.arange(T), None, None) for j in range(1, m)])[1][0]))
        return time.perf_counter() - t0

    # ---- the loop
    def _loop(self) -> None:
        while True:
            with self._lock:
                idle = not self._active
                while not self._waiting and not self._active:
                    if self._closed:
                        return
                    self._wake.wait()
                if idle:
                    self._collect_burst()
            try:
                self.step()
            except BaseException as e:  # noqa: BLE001 -- a failed shared call ends every admitted request, not the loop
                for s in list(self._active):
                    self._retire(s, "error", e)

    def _collect_burst(self) -> None:
        """Waking from idle (lock held): the requests of one burst come within ms of each other, and their
        first prefill chunks run as one call only if they are admitted at the same step. Wait while they keep
        coming (each within ADMIT_GAP_S of the last, ADMIT_MAX_S in all, until max_batch wait); a lone
        request waits ADMIT_GAP_S."""
        end = time.perf_counter() + ADMIT_MAX_S
        n = len(self._waiting)
        while n < self.max_batch and not self._closed:
            left = end - time.perf_counter()
            if left <= 0:
                return
            self._wake.wait(min(ADMIT_GAP_S, left))
            if len(self._waiting) == n:  # nobody came within the gap
                return
            n = len(self._waiting)

    def step(self) -> bool:
        """One iteration: admit, prefill, one batched decode step, retire. -> whether there was work."""
        self._admit()
        for s in [s for s in self._active if s.c.cancelled]:
            self._retire(s, "cancelled")
        pre = [s for s in self._active if not s.prefilled]
        dec = [s for s in self._active if s.prefilled]
        if self.fixed_budget is None:
            self.prefill_budget = min(self.budget_max, self.chunk * max(len(pre), 1))
        ride = self._ride(pre) if pre and dec else None
        if ride is None and pre:
            self._prefill(pre)
        elif ride is not None and len(pre) > 1 and ride[2] < self.prefill_budget:
            self._prefill(pre[1:], self.prefill_budget - ride[2])  # the budget the ride left, in calls of their own
        if dec:
            self._pack(dec)
            self._decode(dec, ride)
        return bool(pre or dec)

    def _pack(self, dec: list[Sequence]) -> None:
        """Move decoding requests from the highest busy rows into free lower ones while that shrinks the
        decode call's B (a call costs every row in [0, B), busy or not: at the end of a burst, or after early
        finishers, the survivors sit on scattered rows). A move copies the request's committed slots once
        (~46 KB per cached token for SmolLM2); it is made only for a request that has MOVE_MIN_LEFT or more
        tokens to go. Prefilling requests (a riding chunk's among them) stay where they are."""
        while True:
            top = max(dec, key=lambda s: s.row)
            free = min(self.pool.free, default=None)
            if free is None or free > top.row:
                return
            if top.cfg.max_new_tokens - top.emitted < MOVE_MIN_LEFT:
                return
            rest = max((s.row for s in dec if s is not top), default=-1)
            if self.target.batch_for(max(rest, free) + 1) >= self.target.batch_for(top.row + 1):
                return  # the call would cover as many rows after the move
            self.pool.move(top.row, free)
            if self.drafts is not None:
                self.drafts.move(top.row, free)
            top.row, top.cache = free, self.pool.row(free)
            self.counters["moves"] = self.counters.get("moves", 0) + 1

    def _ride(self, pre: list[Sequence]):
        """With a mixed graph, the next prefill chunk of the oldest prefilling request rides in the decode
        rows' call as a group (the weights read once for both) -> (request, T, tokens fed), or None."""
        if not self.groups:
            return None
        s = pre[0]
        T, r = next_chunk(self.target, s.c.generation.stats.prompt_tokens - s.fed, self.prefill_budget)
        top = max(t for name, t in self.target.entry.profiles.items() if not name.startswith("prefill"))
        if self.pool.n[s.row] + T + top > self.pool.S:  # its padding in the batch would not fit after the chunk
            return None
        return s, T, r

    def _admit(self) -> None:
        new = []
        with self._lock:
            self._drop_cancelled()
            while self._waiting and len(self._active) < self.max_batch and self.pool.free:
                c = self._waiting.popleft()
                if c.cancelled:
                    c._finish("cancelled")
                    continue
                try:
                    s = self.make_sequence(c)
                except BaseException as e:  # noqa: BLE001
                    c._finish("error", e)
                    continue
                s.chain_hits, s.chain_tries = 2.0 * self._chain_prior(s), 2.0  # what its drafter's chains made
                s.row = self.pool.acquire()
                s.cache = self.pool.row(s.row)
                self._active.append(s)
                new.append(s)
            self.pool.reserve(self._room())  # one growth for everyone admitted now, not one per bucket on the way
        for s in new:
            if self.prefixes is not None:  # the longest cached run of its first tokens: not prefilled again
                P, kv = self.prefixes.lookup(s.ids[:s.c.generation.stats.prompt_tokens])
                if P:
                    self.pool.load_prefix(s.row, kv, P)
                    s.fed = s.c.generation.stats.cached_tokens = P
            if self.drafts is not None:
                self.drafts.reset(s.row)

    def _drop_cancelled(self) -> None:
        """(lock held) Finish the waiting requests that were cancelled: their places in the queue free now,
        not when a row frees and admission reaches them."""
        for c in [c for c in self._waiting if c.cancelled]:
            self._waiting.remove(c)
            c._finish("cancelled")

    def _room(self) -> int:
        """Slots the admitted requests may still need: prompt + max_new_tokens + one call's T (capped). The
        pool (bucketed: portable and slots graphs) is sized to it at admission and shrinks to it as requests leave
        (each resize copies the pool); a fixed pool (fused) ignores both."""
        # a decode step's most rows (the prefill profiles are not decode steps)
        T = max(t for name, t in self.target.entry.profiles.items() if not name.startswith("prefill"))
        need = max((s.c.generation.stats.prompt_tokens + s.cfg.max_new_tokens + T for s in self._active), default=1)
        return min(need, self.pool.buckets[-1])

    def _prefill(self, pre: list[Sequence], budget: int | None = None) -> None:
        """Prefill chunks up to the budget (default `prefill_budget`), oldest first: the first chunks of
        requests on neighbouring rows as one batched call (`_first_chunks`), the rest as single-row calls on
        the request's pool row."""
        # nothing decodes yet (a burst's start): nobody waits on prefill, so neither the budget nor its cap on a
        # call's T (the long prefill profiles are for prompts that prefill alone) applies
        waiting = len(pre) < len(self._active)
        budget = (budget or self.prefill_budget) if waiting else 1 << 30
        group = self._first_chunks(pre, budget)
        if group:
            budget -= self._prefill_batch(*group)
            if not waiting and any(s.prefilled for s in group[2]):
                return  # whoever those chunks completed decodes first; the rest prefill within the budget
        for s in pre:
            prompt = s.ids[:s.c.generation.stats.prompt_tokens]
            while budget > 0 and s.fed < len(prompt):
                try:  # a call of this request's row alone: its failure ends this request alone
                    i, r, out = feed_chunk(self.target, s.cache, prompt, s.fed,
                                           self.prefill_budget if waiting else None)
                except BaseException as e:  # noqa: BLE001
                    self._retire(s, "error", e)
                    break
                s.fed = i + r
                s.c.generation.stats.prefill_s += out.run_s
                budget -= r
                if s.prefilled:
                    self._first(s, out.logits[0])
            if budget <= 0:
                return

    def _first_chunks(self, pre: list[Sequence], budget: int):
        """-> (first row, B, requests) for one batched call of first prefill chunks, or None. A fused graph
        runs several new tokens per row at B > 1 only when every row of the call is at n = 0 (onnxruntime's
        GroupQueryAttention "first prompt" mode), so the call covers a run of rows [first, first+B) that
        holds only such requests and free rows (n = 0 too; their padding is never committed). The largest
        group whose chunks fit the budget wins."""
        chunk = self.target.entry.profiles.get("prefill", 1)
        cands = sorted((s for s in pre if s.fed == 0), key=lambda s: s.row)
        if len(cands) < 2 or chunk < 2:
            return None
        busy = {s.row for s in self._active} - {s.row for s in cands}
        best = None
        for r0 in [s.row for s in cands]:
            for B in (b for b in range(2, self.pool.rows + 1) if self.target.runs_batch(b)):
                if r0 + B > self.pool.rows or busy & set(range(r0, r0 + B)):
                    break
                g = [s for s in cands if r0 <= s.row < r0 + B]
                if len(g) < 2:
                    continue
                if len(g) * chunk > budget:
                    break
                if best is None or len(g) > len(best[2]):
                    best = (r0, B, g)
        return best

    def _prefill_batch(self, r0: int, B: int, group: list[Sequence]) -> int:
        """Run the first chunk of every request in `group` (rows r0.. of a B-row call) -> tokens fed. Logits
        only at the last rows of the prompts that chunk completes (every row gets the same T indices)."""
        chunk = self.target.entry.profiles["prefill"]
        lens = [min(s.c.generation.stats.prompt_tokens, chunk) for s in group]
        T = max(lens) if self.target.any_t else min(t for t in self.target.profile_ts if t >= max(lens))
        ids = np.zeros((B, T), dtype=np.int64)
        for s, r in zip(group, lens):
            ids[s.row - r0, :r] = s.ids[:r]
        last = sorted({r - 1 for s, r in zip(group, lens) if r == s.c.generation.stats.prompt_tokens}) or [0]
        out = self.target.step_batch(self.pool, ids, np.broadcast_to(np.arange(T), (B, T)).copy(),
                                     first=r0, rows=last)
        pb = self.counters["prefill_batch"]
        pb[len(group)] = pb.get(len(group), 0) + 1
        for s, r in zip(group, lens):
            self.pool.commit(s.row, out.new_kv, s.row - r0, range(r))
            s.fed = r
            s.c.generation.stats.prefill_s += out.run_s  # the call's time: this request waited all of it
            if s.prefilled:
                self._first(s, out.logits[s.row - r0, last.index(r - 1)])
        return sum(lens)

    def _decode(self, dec: list[Sequence], ride=None) -> None:
        t0 = time.perf_counter()
        B = self.target.batch_for(max(s.row for s in dec) + 1)  # the rows [0, B) the call covers
        # onnxruntime's own fused attention runs T = 1 only at B > 1: nothing to draft in the batched call, but
        # 2..groups+1 requests can verify apart in one mixed call; with specexport's kernel every row verifies
        verify = max(self.target.batch_ts(B)) > 1
        # the guard has paused speculation at this B (adaptive requests only): nobody drafts, the call is T = 1
        paused = any(s.cfg.adaptive for s in dec) and not self.payoff.allows(B)
        apart = ride is None and self.groups and 2 <= len(dec) <= self.groups + 1 and not verify
        if self.drafts is not None:
            self._model_drafts(dec, B, apart or (verify and not paused), ride is not None)
        if apart and self._verify_apart(dec):
            return
        dec = [s for s in dec if s in self._active]  # one whose drafter failed there has ended
        # nothing to verify when every request drafts with the model or not at all and the model proposed nothing
        # (priced out): a plain step, without the trees and the choice of T (~0.5 ms of a ~35 ms 8-row step)
        plain = paused or all(s.drafter is None or (isinstance(s.drafter, RowDraft) and not s.drafter.props)
                              for s in dec)
        # drafts beyond max_new_tokens - emitted - 1 could not be emitted; none when the call cannot verify
        trees = self._drafts(dec, lambda s: s.cfg.max_new_tokens - s.emitted - 1 if verify and not plain else 0)
        if not dec:
            return
        T = self._choose_T(B, dec, trees, plain)
        ids = np.zeros((B, T), dtype=np.int64)
        pos = np.zeros((B, T), dtype=np.int64)
        mask = np.broadcast_to(np.eye(T, dtype=bool), (B, T, T)).copy()  # pad rows see themselves only
        for b in range(B):
            pos[b] = self.pool.n[b]  # pad rows: positions of their own free slots
        for s, t in zip(dec, trees):
            i, p, m = t.inputs(T, len(s.ids))
            ids[s.row], pos[s.row], mask[s.row] = i, p, m[0]
        if ride is None:
            drafting = time.perf_counter() - t0  # the host work before the call: drafts, T, inputs
            out = self.target.step_batch(self.pool, ids, pos, mask)
            self.costs.update(B, T, out.run_s)
            before = sum(s.emitted for s in dec)
        else:
            p, Tc, r = ride
            chunk = p.ids[p.fed:p.fed + r] + [0] * (Tc - r)
            n = int(self.pool.n[p.row])
            last = p.fed + r == p.c.generation.stats.prompt_tokens  # completes the prompt: its last row's logits
            out, (g,) = self.target.step_mixed(self.pool, ids, pos, mask,
                                               [(p.row, chunk, np.arange(n, n + Tc), None, [r - 1] if last else [])])
            self.pool.commit(p.row, g.new_kv, 0, range(r))
            p.fed += r
            p.c.generation.stats.prefill_s += out.run_s
            self.counters["rides"] = self.counters.get("rides", 0) + 1
            if last:
                self._first(p, g.logits[0])
        self.counters["steps"] += 1
        self.counters["batch"][B] = self.counters["batch"].get(B, 0) + 1
        if B > 1 and T > 1:
            self.counters["batch_verify"] = self.counters.get("batch_verify", 0) + 1
        for s, t in zip(dec, trees):
            try:
                self._accept(s, t, T, out)
            except BaseException as e:  # noqa: BLE001 -- one request's failure ends it alone
                self._retire(s, "error", e)
        if ride is None and any(s.cfg.adaptive for s in dec):  # the guard keeps B >= Payoff.MIN_ROWS only
            drafted = any(len(t) > 1 for t in trees)  # else a plain step (paused or unverifiable steps draft roots)
            self.payoff.record(B, T, sum(s.emitted for s in dec) - before, len(dec), out.run_s, self.costs.cost(B, 1),
                               host=drafting if drafted else 0.0)
        self.pool.shrink(self._room())

    def _verify_apart(self, dec: list[Sequence]) -> bool:
        """2..groups+1 requests decoding: each verifies its own draft in one mixed call (the lowest row as a
        batch of one, the others as groups: onnxruntime's attention takes several new tokens per row with a
        past only in a batch of one), if that beats one plain batched step -> whether it ran."""
        dec = sorted(dec, key=lambda s: s.row)
        trees = self._drafts(dec, lambda s: s.cfg.max_new_tokens - s.emitted - 1)
        if len(dec) < 2:
            return False  # the rest decode in the plain step
        caps = [min(len(t), s.cfg.k + 1 if s.drafter is not None else 1) for s, t in zip(dec, trees)]
        if max(caps) < 2:
            return False
        ts = sorted({t for name, t in self.target.entry.profiles.items() if name.startswith("verify_")})
        m = len(dec)
        if any(s.cfg.adaptive for s in dec):
            cums = [np.concatenate([[1.0], 1.0 + np.cumsum(t.score[1:])]) for t in trees]
            T = self.pair_costs.best(m, ts, lambda T: sum(c[min(T, cap) - 1] for c, cap in zip(cums, caps)))
            B = self.target.batch_for(dec[-1].row + 1)
            gain = sum(c[min(T, cap) - 1] for c, cap in zip(cums, caps)) / self.pair_costs.cost(m, T)
            if gain <= m / self.costs.cost(B, 1):
                return False
        else:
            T = next((t for t in ts if t >= max(caps)), ts[-1])
        if max(int(self.pool.n[s.row]) for s in dec) + T > self.pool.S:  # near the capacity: plain steps
            return False
        calls = []
        for s, t in zip(dec, trees):
            i, p, mk = t.inputs(T, len(s.ids))
            calls.append((s.row, i, p, mk[0], None))
        lead = calls[0]
        out, gs = self.target.step_mixed(self.pool, np.asarray(lead[1])[None], np.asarray(lead[2])[None],
                                         lead[3][None], [c for c in calls[1:]], first=lead[0])
        self.pair_costs.update(m, T, out.run_s)
        self.counters["steps"] += 1
        self.counters["apart"] = self.counters.get("apart", 0) + 1
        outs = [out] + [StepOut(g.logits[None], g.new_kv, g.run_s, None if g.top is None else g.top[None]) for g in gs]
        for s, t, o in zip(dec, trees, outs):
            try:
                self._accept(s, t, T, o, b=0)
            except BaseException as e:  # noqa: BLE001 -- one request's failure ends it alone
                self._retire(s, "error", e)
        return True

    def _model_drafts(self, dec: list[Sequence], B: int, verifies: bool, ride: bool = False) -> None:
        """The draft model's proposals for this step's requests with draft="model", all in shared calls
        (PoolDrafts.run), before anyone builds a tree (`_draft` reads them); none when the step can verify
        nothing (`verifies` False: a fused B > 1 call decodes T = 1 only and no verify apart is possible), so
        a draft with a pool of its own falls behind and catches up in chunks when it drafts again (one on the
        target's pool starts from the target's committed length at every step). At one row (CONFIDENT_ROWS)
        k="auto" requests draft up to CONFIDENT_K tokens, each stopping where the chance that its next proposal
        is accepted no longer pays for that proposal's draft call."""
        want = [s for s in dec if isinstance(s.drafter, RowDraft)]
        for s in want:
            s.drafter.props = []
        if not want or not verifies:
            return
        auto_rows = [s for s in want if s.cfg.adaptive]
        auto = self._model_k(auto_rows, B, ride)
        if not auto:  # priced out: as a chain offered and not verified would (CHAIN_PRIOR_PULL), their rates drift
            for s in auto_rows:  # to the drafter's pooled acceptance, so they are tried again, not frozen at k = 0
                self._pull_to_prior(s)
        bars = {}
        if auto and B <= CONFIDENT_ROWS:  # deeper while the draft is sure: each row stops where it stops paying
            cap = min([s.cfg.k for s in auto_rows] + [CONFIDENT_K])
            auto = max([auto] + [k for k in self.target.entry.verify_ks() if k <= cap])
            # one more proposal adds the chance that it and every one before it are accepted, C * rate (rate its
            # own, not yet drafted, at the request's running acceptance); it pays while that many tokens per
            # second of its draft call beat the step's expected tokens per second (`_model_k`): C * rate >
            # spec_rate * dc. Replayed with the engine's call costs (experiments/draft_confidence.py "marginal",
            # 2026-12-07 `epyc-zen4`): a step's 5.3 ms int8 draft call against its ~0.13 tokens/ms draws the
            # line at C ~0.75, the int4's 3.9 ms at ~0.55 with its lower rate; a cut at one chance for both
            # (0.8) made 136.6 / 101.9 tokens/s against this rule's 136.6 / 103.4
            dc = self.drafts.token_cost(B)
            bars = {s.row: self.spec_rate * dc / max(r, 1e-3) for s, r in zip(auto_rows, self._chain_rates(auto_rows))}
        pairs = [(s, min(auto if s.cfg.adaptive else s.cfg.k, s.cfg.max_new_tokens - s.emitted - 1)) for s in want]
        pairs = [(s, k) for s, k in pairs if k > 0]
        if pairs:
            spent = self.drafts.run(pairs, bars)
            for s, _ in pairs:
                s.c.generation.stats.draft_s += spent / len(pairs)

    def _model_k(self, auto: list[Sequence], B: int, ride: bool = False) -> int:
        """The draft length this step for the requests drafting with the model and k="auto": the k of the built
        verify profiles (T = k + 1) that maximises their expected emitted tokens, sum of 1 + rate + ... +
        rate^k over them (rate: each one's running acceptance plus the drafter's `_rate_offset`), per second of
        the target's (B, T) call plus the k shared draft calls (both measured); at least 1, so that the
        acceptance keeps being measured, except where the guard acts (B >= Payoff.MIN_ROWS) and has measured a B of
        B's built batch size since its last pause (`_spec_measured`): there 0 when even the best k delivers fewer
        tokens per second than a plain call, whose drafts the choice of T would then not verify (a step that
        drafts k = 2 for 8 rows and runs T = 1 pays two draft calls, ~16 ms against a ~22 ms plain call, for
        nothing). The guard's retries (its first step at a B, and the first after each pause, which doubles while
        they fail) still draft, so the rates and costs keep being measured; so does every step after PROBE_STEPS
        priced out at B's built batch size, or after the plain steps a retry loses over PROBE_LOSS where that is
        more (doubling while the retries are priced out too). Between ks that pay, the choice keeps the T it chose
        last at B unless another is K_MARGIN ahead. A first try that the prices say will not pay waits for a step
        without a riding prefill chunk (`ride`): the guard measures only those, so a try in a ride measured nothing
        and the next step tried again (under Poisson arrivals at 8 requests, 4 of 7 drafting steps at B >= 3 were
        such tries in rides, 104-224 ms against 30-122 ms for rides at the same B without drafts, 2026-12-06,
        `epyc-zen3`); one the prices say will pay drafts in a ride too. No tries at all at a B where even rate 1
        (T tokens a row) would not beat plain: at 8 rows on `epyc-zen4` (2026-12-07) an (8, 3) call was priced 45.7
        ms and a draft call 15.5 against a 19.0 ms plain call, and each try chose T = 1 and paid its two draft
        calls for nothing."""
        if not auto:
            return 0
        ts = sorted(t for name, t in self.target.entry.profiles.items()
                    if name.startswith("verify_") and t - 1 <= min(s.cfg.k for s in auto))
        dc = self.drafts.token_cost(B)
        step = {T: self.costs.cost(B, T) + (T - 1) * dc for T in ts}  # seconds of the (B, T) call and its drafts
        plain = len(auto) / self.costs.cost(B, 1)
        # where not even every drafted token accepted would beat plain steps (the (B, T) calls and the draft's
        # cost more than T plain steps), the guard's tries measure nothing that could change the choice: none
        if B >= Payoff.MIN_ROWS and ts and max(len(auto) * T / step[T] for T in ts) <= plain:
            return 0
        rates = self._chain_rates(auto)
        gain = {T: sum(chain_tokens(r, T) for r in rates) / step[T] for T in ts}
        best = max(ts, key=gain.get, default=2)
        last = self.last_T.get(B)
        if last in gain and gain[best] < (1 + K_MARGIN) * gain[last]:
            best = last
        self.last_T[B] = best
        self.spec_rate = gain.get(best, 0.0) / len(auto)  # a row's expected tokens per second at that k
        cls = self._built(B)
        measured = self._spec_measured(B)
        if ride and B >= Payoff.MIN_ROWS and not measured and ts and gain[best] <= plain:
            return 0
        if measured and ts and gain[best] <= plain:
            out = self.priced_out.setdefault(cls, [0, 0])
            out[0] += 1
            steps = step[best] / self.costs.cost(B, 1)  # a retry's, in plain steps
            wait = max(PROBE_STEPS, round((1 - gain[best] / plain) * steps / PROBE_LOSS))
            if out[0] < wait << min(out[1], PROBE_DOUBLINGS):
                return 0
            out[:] = [0, out[1] + 1]  # a retry: this step drafts
        else:
            self.priced_out.pop(cls, None)
        return best - 1

    def _chain_rates(self, auto: list[Sequence]) -> list[float]:
        """Each request's expected per-token acceptance: its running rate plus its drafter's `_rate_offset`."""
        off = self._rate_offset(type(auto[0].drafter))
        return [min(max(s.chain_rate + off, 0.0), 1.0) for s in auto]

    def _spec_measured(self, B: int) -> bool:
        """Whether the guard has measured speculation since its last pause at any B of B's built batch size (B =
        9..16 of --batch 8,16 are one, 5..8 another): then the choice of k at B may be 0 without a try of its own.
        The fused graphs run every B up to the largest built, and a burst of 16 requests decodes at each B from 8
        to 16 in turn: a first try of k >= 1 at each (a (16, 3) call and two draft calls, ~81 ms against a 28 ms
        plain one) cost k = "auto" 2% against plain there (2026-12-05, `xeon-m207`); its tail decodes at 8, 7, 6
        rows in turn, and a try at each of those was ~4 of a burst's ~12 retries (2026-12-06, `epyc-zen3`). Across
        built sizes each keeps its own try (one "no" at 3 rows is not taken for 8)."""
        lo = max([b for b in self.target.batch_sizes if b < B], default=0) + 1
        return any(self.payoff.measured(b) for b in range(max(Payoff.MIN_ROWS, lo), self._built(B) + 1))

    def _built(self, B: int) -> int:
        """The built batch size a call of B rows runs in: the smallest built one >= B."""
        return next((b for b in self.target.batch_sizes if b >= B), B)

    def _drafts(self, dec: list[Sequence], room) -> list[Tree]:
        """Each request's draft tree (`_draft` with room(request)); a request whose drafter raises ends alone
        ("error") and leaves `dec`, so trees and dec stay aligned."""
        trees = []
        for s in list(dec):
            try:
                trees.append(self._draft(s, room(s)))
            except BaseException as e:  # noqa: BLE001 -- one request's drafter failing ends it alone
                self._retire(s, "error", e)
                dec.remove(s)
        return trees

    def _draft(self, s: Sequence, room: int) -> Tree:
        d, k = s.drafter, s.cfg.k
        if d is None or room <= 0:
            return Tree.root(s.ids)
        if isinstance(d, RecycleDrafter):
            return d.draft(s.ids, k, room)
        return Tree.chain(s.ids, d.propose(s.ids, min(k, room)).tokens, s.chain_rate)  # ngram: node i scored rate ** i

    def _choose_T(self, B: int, dec: list[Sequence], trees: list[Tree], plain: bool = False) -> int:
        # a call's padding rows must fit too: near the capacity only the T that fit n + T of every row the
        # call covers (a row below the decoding ones may be a prompt that is part-way or just done)
        room = self.pool.buckets[-1] - int(self.pool.n[:B].max())
        ts = [T for T in self.target.batch_ts(B) if T <= room] or [1]
        caps = [min(len(t), s.cfg.k + 1 if s.drafter is not None else 1) for s, t in zip(dec, trees)]
        if not any(s.cfg.adaptive for s in dec):
            need = max(caps)
            return next((T for T in ts if T >= need), ts[-1])
        if plain and ts[0] == 1:  # the guard paused speculation at this B, or nothing was drafted
            return 1
        cums = [np.concatenate([[1.0], 1.0 + np.cumsum(t.score[1:])]) for t in trees]
        return self.costs.best(B, ts, lambda T: sum(c[min(T, cap) - 1] for c, cap in zip(cums, caps)))

    def _accept(self, s: Sequence, tree: Tree, T: int, out, b: int | None = None) -> None:
        """Accept row b of `out` (default the request's pool row) for request s, commit, stream."""
        b = s.row if b is None else b
        st = s.c.generation.stats
        n = min(T, len(tree), s.cfg.k + 1 if s.drafter is not None else 1)
        logits = out.logits[b]
        check_finite(logits[:n], "target")
        emitted, path = accept_tree(logits, tree, n, len(s.ids), s.pick)
        self.pool.commit(s.row, out.new_kv, b, path)
        if isinstance(s.drafter, RowDraft):
            self.drafts.accepted(s, len(emitted) - 1, n - 1)
        if isinstance(s.drafter, RecycleDrafter):
            s.drafter.verified(tree, path, emitted, logits[:n], None if out.top is None else out.top[b])
        elif s.drafter is not None and n > 1:
            # a chain's tokens are tried in order until the first miss: a accepted of n - 1 tried a + 1 of them
            # (a when all were accepted), and the per-token rate is hits / tries (the geometric law's estimate;
            # a / (n - 1), the share accepted, read a rate of 0.8 at k = 4 as ~0.6 and sized drafts too short)
            a = len(emitted) - 1
            kind = type(s.drafter)
            r = s.chain_rate  # what the geometric law made of this chain's n tokens before the step
            # chains drafted under the doubt rule (cut at the draft's first doubt, or kept for passing it) are
            # not the law's: their acceptance is not the request's rate at every depth
            if not getattr(s.drafter, "screened", False):
                self.rate_fit[kind] = [RATE_FIT_DECAY * x + y for x, y in zip(
                    self.rate_fit.get(kind, (0.0, 0.0, 0.0, 0.0)), (a + 1, chain_tokens(r, n), chain_slope(r, n), 1))]
            s.chain_hits, s.chain_tries = _decayed(s.chain_hits, s.chain_tries, a, a < n - 1)
            self.chains[kind] = _decayed(*self.chains.get(kind, CHAIN_PRIOR_START), a, a < n - 1)
        elif s.drafter is not None and len(tree) > 1 and s.cfg.adaptive:
            self._pull_to_prior(s)
        a = len(emitted) - 1
        st.steps += 1
        st.proposed += n - 1
        st.accepted += a
        if a >= len(st.hist):
            st.hist += [0] * (a + 1 - len(st.hist))
        st.hist[a] += 1
        st.verify_s += out.run_s
        self._emit(s, emitted)

    def _rate_offset(self, kind) -> float:
        """What to add to the running rates of kind's requests so that the geometric law expects what their
        verified chains emitted: (emitted - expected) / the law's slope, summed over those chains (one Newton
        step from 0; rate_fit), within +-RATE_FIT_MAX; 0 until RATE_FIT_STEPS such chains ran (chains drafted
        under the doubt rule left out). The running rates trail the acceptance by ~0.03: replayed on fixed-k
        bursts of the int4 self-draft at 4 rows, the law at each request's rate expected 3.2% / 5.8% / 11% fewer
        tokens than chains of 2 / 4 / 8 drafted tokens emitted, and at the rate + 0.03 within 1% at every
        length (per-depth acceptance was flat, 0.80-0.85; 2026-12-06, `xeon-m207`). One offset for every
        length: a scale per chain length (the earlier chain_fit) learned only the lengths chosen, and left the
        longer ones at the law's underestimate, so at 4 rows k = 2 was chosen where k = 4 was faster."""
        emitted, expected, slope, steps = self.rate_fit.get(kind, (0.0, 0.0, 0.0, 0.0))
        if steps < RATE_FIT_STEPS or slope <= 0:
            return 0.0
        return min(max((emitted - expected) / slope, -RATE_FIT_MAX), RATE_FIT_MAX)

    def _pull_to_prior(self, s: Sequence) -> None:
        """A step where s's chain was not verified: its running rate moves CHAIN_PRIOR_PULL of the way to the
        drafter's pooled acceptance (its tries unchanged)."""
        s.chain_hits += CHAIN_PRIOR_PULL * (self._chain_prior(s) * s.chain_tries - s.chain_hits)

    def _chain_prior(self, s: Sequence) -> float:
        """The acceptance of s's drafter's chains over every request's verified steps (0.5 before any)."""
        hits, tries = self.chains.get(type(s.drafter), CHAIN_PRIOR_START)
        return hits / tries

    def _first(self, s: Sequence, logits: np.ndarray) -> None:
        """The whole prompt is in the cache: the logits of its last row [V] give the first token (no decode
        row for it), exactly as a decode step's row would pick it."""
        self._keep(s)
        try:
            check_finite(logits[None], "target")
            self._emit(s, [s.pick.target(logits, len(s.ids))])
        except BaseException as e:  # noqa: BLE001 -- one request's failure ends it alone
            self._retire(s, "error", e)

    def _emit(self, s: Sequence, emitted: list) -> None:
        """Append accepted tokens, stream their text, retire the request when it is done."""
        st = s.c.generation.stats
        s.ids += emitted
        s.emitted += len(emitted)
        self.counters["tokens"] += len(emitted)
        piece, done = s.text.push(emitted)
        st.total_s = time.perf_counter() - s.t0
        if piece:
            s.c._put(piece)
        if done or s.emitted >= s.cfg.max_new_tokens:
            self._retire(s, s.c.generation.finish_reason or "length")

    def _keep(self, s: Sequence) -> None:
        """Its committed K/V (the prompt at its first token, prompt and answer when it ends) into the prefix
        cache: a copy of ~46 KB per token for SmolLM2."""
        if self.prefixes is not None:
            self.prefixes.insert(s.ids[:int(self.pool.n[s.row])], self.pool.data[:, :, s.row])

    def cache_prefix(self, ids: list) -> None:
        """Prefill `ids` once on a free row and keep their K/V for the requests that start with them (a
        service's system prompt; Pipeline.start_engine gives it the chat template's preamble). Call it before
        submitting requests, from the thread that started the engine."""
        if self.prefixes is None or len(ids) < 2 or not self.pool.free:
            return
        r = self.pool.acquire()
        try:
            self.pool.reserve(len(ids))
            feed(self.target, self.pool.row(r), list(ids))
            self.prefixes.insert(list(ids), self.pool.data[:, :, r])
        finally:
            self.pool.release(r)

    def _retire(self, s: Sequence, reason: str, error: BaseException | None = None) -> None:
        if reason in ("eos", "stop", "length") and s in self._active and s.prefilled:
            self._keep(s)  # its answer may be the next turn's prompt
        with self._lock:
            if s not in self._active:
                return
            self._active.remove(s)
            self.pool.release(s.row)
            self.counters["finished"][reason] = self.counters["finished"].get(reason, 0) + 1
        st = s.c.generation.stats
        st.total_s = time.perf_counter() - s.t0
        st.new_tokens = len(s.c.generation.token_ids)
        s.c._finish(reason, error)
