"""What a target call costs: running averages of measured seconds per (B, T) call, and a prior for the
calls not measured yet. The one step-cost model of the runtime (the tree sizer, adaptive k and the engine's
choice of T per step all price calls here).

Prior for a call not measured yet: between two measured calls of the same T, one of fewer rows and one of more,
the straight line in B between the nearest two (the batching engine runs every B on the fused graphs, and warms
only the built ones); else, once calls of two or more sizes are measured, the least-squares line seconds = a +
b * rows through them (rows = B*T) where its a and b are positive; else the cheapest measured call scaled by
1 + 0.05 per extra row (on 2-core CPUs one extra row of a SmolLM2 call costs 4-10% of a one-row call,
docs/benchmarks.md); the last two never below a measured call of as many rows or fewer. The int4 self-draft's
B-row calls on an AVX2-only CPU grow faster than a line (4.2, 8.8, 20 ms at 1, 4, 8 rows): no positive
intercept, and the scaled one-row call priced 7 rows at 5.5 ms against ~22 measured, so 7- and 6-row steps
drafted where the 8-row ones were priced out (2026-12-06, `epyc-zen3`).
"""
from __future__ import annotations

import numpy as np

ROW = 0.05  # prior cost of one more row, relative to a one-row call


def chain_tokens(r: float, n: int) -> float:
    """The tokens a step verifying a chain of n - 1 drafted tokens emits by the geometric law at per-token rate r:
    1 + r + ... + r^(n-1) (the solo KPolicy and the engine's choice of k both price drafts by it)."""
    return (1 - r ** n) / (1 - r) if r < 1 else float(n)


def chain_slope(r: float, n: int) -> float:
    """d chain_tokens(r, n) / dr: 1 + 2r + ... + (n-1) r^(n-2)."""
    return sum(j * r ** (j - 1) for j in range(1, n))


class StepCosts:
    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self.seen: dict = {}  # (B, T) -> seconds (exponential moving average)
        self._prior = None  # (a, b, one) of the prior below, from `seen` as it is; None after an update

    def update(self, B: int, T: int, seconds: float) -> None:
        old = self.seen.get((B, T))
        self.seen[(B, T)] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
        self._prior = None

    def cost(self, B: int, T: int) -> float:
        c = self.seen.get((B, T))
        if c is not None:
            return c
        if not self.seen:
            return 1 + ROW * (B * T - 1)
        lo = max((b for b, t in self.seen if t == T and b < B), default=None)
        hi = min((b for b, t in self.seen if t == T and b > B), default=None)
        if lo is not None and hi is not None:
            c0, c1 = self.seen[(lo, T)], self.seen[(hi, T)]
            return c0 + (c1 - c0) * (B - lo) / (hi - lo)
        # the prior's fit, made once per update: the engine prices ~5 unmeasured shapes per step (the batch sizes
        # between the built ones, and the draft's), and a fit per price was ~0.7 ms of a ~35 ms 8-row step of
        # SmolLM2 (np.polyfit, 2026-12-06, `epyc-zen3`)
        if self._prior is None:
            self._prior = self._fit()
        a, b, one = self._prior
        prior = a + b * B * T if b > 0 and a > 0 else one * (1 + ROW * (B * T - 1))
        return max([prior] + [c for (x, t), c in self.seen.items() if x * t <= B * T])  # never below fewer rows

    def _fit(self) -> tuple:
        """(a, b) of the least-squares line seconds = a + b * rows through the measured calls (0, 0 while they
        are of one size), and a one-row call's seconds estimated from the cheapest of them."""
        rows = np.array([b * t for b, t in self.seen], dtype=float)
        secs = np.array(list(self.seen.values()))
        one = float(np.min(secs / (1 + ROW * (rows - 1))))
        if np.ptp(rows) == 0:
            return 0.0, 0.0, one
        x = rows - rows.mean()
        b = float(x @ (secs - secs.mean()) / (x @ x))
        return float(secs.mean()) - b * float(rows.mean()), b, one

    def best(self, B: int, ts, expected) -> int:
        """The T of `ts` with the most expected tokens per second: expected(T) / cost(B, T)."""
        return max(ts, key=lambda T: expected(T) / self.cost(B, T))


class Payoff:
    """Whether speculating still pays at a batch size, by what it delivered: the realized tokens per row per second of
    the steps that drafted (the ratio of two moving averages, their tokens per row and their seconds of call and
    of the drafting before it: the drafts, the choice of T and the inputs, paid also by the steps whose choice
    was T = 1, which the calls alone did not show; all the host work of an adaptive step at 4 rows of SmolLM2 on 2 cores is ~1.3 ms
    against ~1.0 ms for a plain one and a ~21 ms call, experiments/host_time.py) against a plain call's one
    token per row per plain second (a (B, 1) call that follows a (B, 1) call; the first estimate is the cost
    table's, measured by the engine's warm-up the same way). While paused, the engine drafts nothing at that B.
    The choice of T trusts the drafts' scores and the cost of each (B, T) call alone; where the scores overrate
    the drafts, or where a change of call shape costs extra on its own (~21 ms on OpenVINO's dynamic model,
    bf16 SmolLM2, against a 55 ms call: a speculating step pays it going to T and coming back, and the cost
    table then prices both T = 1 and T > 1 with it), speculation delivered 0.5-0.8x plain decoding through the
    engine (docs/benchmarks.md "The batching engine on OpenVINO bfloat16"). Once `settle` steps drafted and the
    average is below MARGIN (0.95) of plain, that batch size decodes plain for `pause` steps, then speculation is tried again from a fresh average; a
    retry that falls behind again doubles the next pause (up to 16x), one that keeps up resets it. A step's
    acceptance swings between all and nothing (the int4 self-draft at 4 rows, k = 4: 19% of the rows accepted
    none, 45% all four), so an average of each step's own rate (weight 0.3), judged after every step, paused 4
    rows on a stretch of misses that the next steps would have paid for: 38 paused steps of ~140 in a burst
    that fixed k = 4 ran without any, 0.98x it; averaging tokens and seconds apart (weight 0.1) and judging from
    the 8th step: no pause, 1.00x (experiments/guard_ab.py, 2026-12-05, `xeon-m207`). It
    guards B >= MIN_ROWS only (below, `allows` is always true and `record` keeps nothing): one or two rows compete with few others, a (2, 3) call costs about
    what a (1, 5) one does, and pausing there lost: 6% at one row on onnxruntime (0.94x in 4 of 4 interleaved
    rounds, experiments/payoff_ab.py), 6-8% at two (the guard left off below 3 rows: 1.06x / 1.08x the guarded
    choice on the medians, 8 of 9 rounds ahead, `experiments/adaptive_ab.py --guard-from 3`, 2026-12-04,
    `epyc-zen4`; there the drafts' scores delivered what they promised, 1.06x), where low-acceptance stretches
    paused speculation that the stretches after them would have paid for, and the recycle drafter's table
    learns from fewer rows."""

    MIN_ROWS = 3  # the smallest batch size guarded

    MAX_DOUBLINGS = 4  # a pause grows to at most pause * 2 ** 4 steps
    # speculation pauses only below this share of plain's rate: plain's price is the warm-up's cheaper call or an
    # average from the last run of plain steps, speculation's is from the latest steps, and this machine's speed
    # drifts between them; at 4 rows the guard paused on 1.00x its (4, 1) warm-up price of 18.1 ms, and the
    # paused (4, 1) calls then took 19.5 ms (speculation had been 1.08x them) (2026-12-05, `xeon-m207`)
    MARGIN = 0.95

    def __init__(self, smoothing: float = 0.1, pause: int = 32, settle: int = 8):
        self.smoothing, self.pause, self.settle = smoothing, pause, settle
        # B -> moving averages of the tokens per row and of the seconds (call and drafting) of the steps that
        # drafted; their ratio is the realized rate
        self.tokens: dict = {}
        self.seconds: dict = {}
        self.steps: dict = {}  # B -> steps that drafted since the last pause
        self.plain: dict = {}  # B -> seconds of a (B, 1) call in a run of them
        self.plain_left: dict = {}  # B -> plain steps left before speculating again
        # B -> pauses in a row, each after a retry that fell behind plain again: the next pause is twice as long
        # (where speculation does not pay, every retry is a step or two that costs more than it delivers)
        self.fails: dict = {}
        self.last = None  # (B, T) of the previous call

    def allows(self, B: int) -> bool:
        return B < self.MIN_ROWS or not self.plain_left.get(B)

    def measured(self, B: int) -> bool:
        """Whether speculation at B (guarded) has a realized rate since its last pause: its retry has run."""
        return B in self.steps

    def rate(self, B: int) -> float:
        """Realized tokens per row per second of the steps that drafted at B since the last pause."""
        return self.tokens[B] / self.seconds[B]

    def _ema(self, d: dict, key, x: float) -> None:
        d[key] = x if key not in d else (1 - self.smoothing) * d[key] + self.smoothing * x

    def record(self, B: int, T: int, tokens: int, rows: int, seconds: float, plain_s: float,
               host: float = 0.0) -> None:
        """One call of B rows and T tokens each, `rows` of them requests' rows that emitted `tokens` in all,
        in `seconds`; plain_s: the cost table's (B, 1) call, the first estimate of a plain call at B; host: the
        seconds of drafting before the call (the drafts, the choice of T, the inputs), 0 where nothing was
        drafted (a paused step, or one whose requests had no drafts). A step that drafted is speculation's,
        whatever T it chose: its tokens per row per second of call and drafting go into the average, so drafts
        made only to choose T = 1 count against it too."""
        if B < self.MIN_ROWS:
            return
        run, self.last = self.last == (B, T), (B, T)
        self.plain.setdefault(B, plain_s)
        if T == 1 and run:
            self._ema(self.plain, B, seconds)
        if T == 1 and not host:
            if self.plain_left.get(B):
                self.plain_left[B] -= 1
                if not self.plain_left[B]:  # try again from nothing
                    for d in (self.tokens, self.seconds, self.steps):
                        d.pop(B, None)
            return
        self._ema(self.tokens, B, tokens / rows)
        self._ema(self.seconds, B, seconds + host)
        self.steps[B] = self.steps.get(B, 0) + 1
        if self.steps[B] < self.settle:  # not judged yet
            return
        if self.rate(B) < self.MARGIN / self.plain[B]:
            self.plain_left[B] = self.pause << min(self.fails.get(B, 0), self.MAX_DOUBLINGS)
            self.fails[B] = self.fails.get(B, 0) + 1
        else:
            self.fails.pop(B, None)
