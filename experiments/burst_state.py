"""(a helper, not a probe) What the experiments that run bursts on one engine share: `loaded`, a bundle and its
prompts ready, `afresh`, the engine's learnt state reset before a burst, `burst`, one burst from that fresh state,
and `verify_ks`, the bundle's verify profiles cut to some k as if built with only them.
"""
import time

import specexport
from specexport.bench.config import find_questions, questions
from specexport.runtime.costs import Payoff
from specexport.runtime.drafters import Doubt


def loaded(bundle: str, limit: int, order: str, max_batch: int):
    """-> (pipe, prompts): the bundle on 2 threads, its engine started with `max_batch` rows, `limit` Spec-Bench
    questions as chat prompts (order "round-robin" over the categories, or "bench": the first `limit` of 4 per
    category in file order, as `specexport bench --requests N` takes them), each prefilled once so that the
    prefix cache holds it before the first burst."""
    pipe = specexport.load(bundle, threads=2)
    qs = questions(find_questions(None), 4)[:limit] if order == "bench" else questions(find_questions(None), 4, limit)
    prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
    pipe.start_engine(max_batch=max_batch, max_queue=len(prompts))
    for x in prompts:
        pipe.submit(x, max_new_tokens=2).wait(600)
    return pipe, prompts


def afresh(pipe) -> None:
    """Before a burst: an empty successor table, the speculation guard anew, no pooled chain acceptance that new
    requests start from, no chances one row's drafts learnt (drafters.model.Doubt), and the draft's successor
    table and guess hit rate as a new engine has them (PoolDrafts). The chains' rate offset
    (Engine.rate_fit), the measured call costs and the last chosen T are kept."""
    pipe.successors = type(pipe.successors)(pipe.successors.succ.shape[0])
    pipe.engine.payoff, pipe.engine.chains = Payoff(), {}
    if pipe.engine.drafts is not None:
        pipe.engine.drafts.doubt = Doubt()
        pipe.engine.drafts.forget(pipe.fresh_table())  # the draft's own successors, for its calls' guesses


def burst(pipe, prompts, n, opts):
    """Every prompt submitted at once with `opts` (submit's keywords), from the state `afresh` leaves -> (tokens
    per second of the whole burst, each request's tokens)."""
    afresh(pipe)
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=n, **opts) for p in prompts]
    toks = [c.wait(600).token_ids for c in cs]
    return sum(len(x) for x in toks) / (time.perf_counter() - t), toks


def verify_ks(pipe):
    """-> use(ks): from then on the engine sees only the verify profiles of draft lengths in ks (None: all the
    bundle built), both in the profiles it prices (entry.profiles) and in the T a call of B rows may take."""
    built, batch_ts, cut = dict(pipe.target.entry.profiles), pipe.target.batch_ts, [None]
    pipe.target.batch_ts = lambda B: [t for t in batch_ts(B) if cut[0] is None or t == 1 or t - 1 in cut[0]]

    def use(ks) -> None:
        cut[0] = ks
        pipe.target.entry.profiles.clear()
        pipe.target.entry.profiles.update({n: t for n, t in built.items()
                                           if ks is None or not n.startswith("verify_") or t - 1 in ks})
    return use
