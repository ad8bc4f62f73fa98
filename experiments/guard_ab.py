"""k="auto" with the engine's speculation guard (runtime/costs.Payoff) and choice of k as they are against their
forms before 2026-12-05 21:00 (an average of each drafted step's own rate, weight 0.3, judged after every step;
auto-step-rates), before 21:20 (k = 0 only at a B measured itself; auto-each-B, and auto-step-rates too) and
before 22:00 (the choice of k by the geometric law alone: no Engine._rate_offset, then a per-length scale; every variant but auto), interleaved: bursts of Spec-Bench
prompts through one batching engine per level, k="auto" under each guard, fixed k and plain decoding, the
order rotated each round.

    python experiments/guard_ab.py BUNDLE [--concurrency 4,8] [--limit 8] [--max-new-tokens 128] [--rounds 3]
        [--k 4] [--draft model|recycle|ngram] [--backend onnxruntime] [--variants step-rates,each-B,uncalibrated]
        (also prob-P, rows-N: the cut of one row's drafts; see --help)
        [--prompts spread|bench]

Per level: tokens per second of each whole burst (medians over rounds, each round's too), each method's ratio
to the better of fixed k and plain, the steps the guard paused per burst, and whether every request's tokens
are the same under all methods.
"""
import argparse
import collections
import json
import math
import time

import numpy as np

import specexport
from specexport.bench.config import find_questions, questions
from specexport.runtime.costs import Payoff
from specexport.runtime import engine as engine_module
from specexport.runtime.drafters import Doubt
from specexport.runtime.engine import Engine
from specexport.runtime.sampling import logsumexp


class StepRates(Payoff):
    """The guard before: an exponential moving average (weight 0.3) of each drafted step's tokens per row per
    second, compared with plain after every step."""

    def __init__(self):
        super().__init__(smoothing=0.3)
        self.avg = {}

    def measured(self, B):
        return B in self.avg

    def record(self, B, T, tokens, rows, seconds, plain_s, host=0.0):
        if B < self.MIN_ROWS:
            return
        run, self.last = self.last == (B, T), (B, T)
        self.plain.setdefault(B, plain_s)
        if T == 1 and run:
            self._ema(self.plain, B, seconds)
        if T == 1 and not host:
            if self.plain_left.get(B):
                self.plain_left[B] -= 1
                if not self.plain_left[B]:
                    self.avg.pop(B, None)
            return
        self._ema(self.avg, B, tokens / (rows * (seconds + host)))
        if self.avg[B] < 1 / self.plain[B]:
            self.plain_left[B] = self.pause << min(self.fails.get(B, 0), self.MAX_DOUBLINGS)
            self.fails[B] = self.fails.get(B, 0) + 1
        else:
            self.fails.pop(B, None)


class ProbDoubt(Doubt):
    """Before 2026-12-07 09:00: one row's drafts stopped at the draft's first proposal of probability below P
    (then 0.3, up to 4 tokens), nothing learnt: a chance of 1 or 0, against a bar of 0.5 (`prob_bars`)."""

    def __init__(self, P):
        super().__init__()
        self.P = P

    def cell(self, logits, t):
        return math.exp(float(logits[t]) - logsumexp(logits)) >= self.P

    def chance(self, cell):
        return float(cell)

    def record(self, cells, a, verified):
        pass


def prob_bars(run):
    return lambda pairs, bars: run(pairs, {r: 0.5 for r in bars})


def each_B(self, B):
    """Before 2026-12-05 21:20: the choice of k at B is 0 only once B itself was measured (not a smaller B of
    the same built batch size)."""
    return self.payoff.measured(B)


def uncalibrated(self, kind):
    """Before 2026-12-05 22:00: the choice of k by the geometric law at the requests' rates alone."""
    return 0.0


_spec_measured, _rate_offset = Engine._spec_measured, Engine._rate_offset
_confident_k, _confident_rows = engine_module.CONFIDENT_K, engine_module.CONFIDENT_ROWS
PAUSED = collections.Counter()  # steps the guard paused, by B
_choose_T = Engine._choose_T


def choose_T(self, B, dec, trees, paused=False):
    PAUSED[B] += paused
    return _choose_T(self, B, dec, trees, paused)


Engine._choose_T = choose_T


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--concurrency", default="4,8")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--draft", default="model", choices=["recycle", "model", "ngram"])
    p.add_argument("--backend", default="onnxruntime")
    p.add_argument("--prompts", default="spread", choices=["spread", "bench"],
                   help="every 10th Spec-Bench question, or the first --limit of the bench's 4 per category")
    p.add_argument("--variants", default="step-rates,each-B,uncalibrated",
                   help="the earlier forms of k=auto to run beside it (comma-separated; empty for none), and "
                        "prob-P: one row's drafts stop at the draft's first proposal below probability P, up to 4 "
                        "(0.3 before 2026-12-07), "
                        "rows-N: the cut up to N rows (1 as it is)")
    a = p.parse_args()
    pipe = specexport.load(a.bundle, threads=2, backend=a.backend)
    if a.prompts == "bench":  # what `specexport bench --requests N` takes: the first N of 4 per category
        qs = questions(find_questions(None), 4)[:a.limit]
    else:  # every 10th question
        qs = [json.loads(line) for line in open(find_questions(None))][:a.limit * 10:10]
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    auto = {"draft": a.draft, "k": "auto"}
    fixed = f"{a.draft}-k{a.k}"
    old = {"step-rates": (auto, StepRates), "each-B": (auto, Payoff), "uncalibrated": (auto, Payoff)}
    old.update({v: (auto, Payoff) for v in a.variants.split(",") if v.startswith(("prob-", "rows-"))})
    methods = {f"auto-{v}": old[v] for v in a.variants.split(",") if v}
    methods.update({"auto": (auto, Payoff), fixed: ({"draft": a.draft, "k": a.k}, Payoff), "plain": ({"draft": "none"}, Payoff)})
    for level in (int(c) for c in a.concurrency.split(",")):
        pipe.start_engine(max_batch=level, max_queue=len(prompts))
        run = pipe.engine.drafts and pipe.engine.drafts.run
        tps, outs, paused = collections.defaultdict(list), {}, collections.defaultdict(list)
        for r in range(a.rounds):
            for m in list(methods)[r % len(methods):] + list(methods)[:r % len(methods)]:
                opts, guard = methods[m]
                pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])
                pipe.engine.payoff, pipe.engine.chains = guard(), {}  # every burst starts afresh
                Engine._spec_measured = each_B if m in ("auto-each-B", "auto-step-rates") else _spec_measured
                Engine._rate_offset = _rate_offset if m in ("auto", fixed, "plain") or "prob-" in m \
                    or "rows-" in m else uncalibrated
                engine_module.CONFIDENT_K = 4 if "prob-" in m else _confident_k
                engine_module.CONFIDENT_ROWS = int(m.split("rows-")[1]) if "rows-" in m else _confident_rows
                drafts = pipe.engine.drafts
                if drafts is not None:  # what the cells learnt is forgotten too
                    drafts.doubt = ProbDoubt(float(m.split("prob-")[1])) if "prob-" in m else Doubt()
                    drafts.run = prob_bars(run) if "prob-" in m else run
                PAUSED.clear()
                t = time.perf_counter()
                cs = [pipe.submit(q, max_new_tokens=a.max_new_tokens, **opts) for q in prompts]
                toks = [c.wait(600).token_ids for c in cs]
                tps[m].append(sum(len(x) for x in toks) / (time.perf_counter() - t))
                outs.setdefault(m, toks)
                paused[m].append(sum(PAUSED.values()))
        med = {m: float(np.median(v)) for m, v in tps.items()}
        ref = max(med[fixed], med["plain"])
        line = "; ".join(f"{m} {med[m]:.1f} ({med[m] / ref:.3f}x the better of {fixed} and plain; rounds "
                         f"{[round(x, 1) for x in tps[m]]}, paused steps {paused[m]})" for m in methods)
        same = all(o == outs["plain"] for o in outs.values())
        print(f"{a.bundle} {a.backend} c={level}: {line}; same tokens: {same}", flush=True)


if __name__ == "__main__":
    main()
