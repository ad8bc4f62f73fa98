"""The batching engine: many requests in the same target calls, each token-identical to its solo run."""
import threading
import time

import numpy as np
import pytest

import specexport
from specexport.errors import OptionError, PromptTooLong, QueueFull
from conftest import build_bundle
from specexport.runtime import prefill
from specexport.runtime.drafters import Doubt, PoolDrafts
from specexport.runtime.kv import KVPool

PROMPTS = ["hello there, general", "abc abc abc abc abc", "The quick brown fox jumps over the lazy dog. The quick",
           "x", "1 2 3 4 5 6 7 8 9 1 2 3 4 5", "to be or not to be, that is the"]
DRAFTS = [("none", None), ("ngram", 4), ("recycle", None), ("recycle", 4), ("ngram", "auto"), ("none", None)]


@pytest.fixture(scope="module")
def bundles(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("eng")
    return {att: build_bundle(root / att, ckpts["target"], ks=(1, 2, 4), capacity=96, chunk=8, attention=att,
                              batch_sizes=(1, 2, 4)) for att in ("fused", "portable")}


def solo(pipe, prompt, **kw):
    return pipe.generate(prompt, draft="none", **kw).token_ids


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_batch_matches_solo_greedy(bundles, attention):
    pipe = specexport.load(bundles[attention])
    assert pipe.manifest.batch_sizes == [1, 2, 4]
    want = [solo(pipe, p, max_new_tokens=24) for p in PROMPTS]
    pipe.start_engine(max_batch=4, max_queue=8)
    cs = [pipe.submit(p, max_new_tokens=24, draft=d, k=k) for p, (d, k) in zip(PROMPTS, DRAFTS)]
    got = [c.wait(60).token_ids for c in cs]
    assert got == want
    st = pipe.engine.stats()
    assert st["finished"] == {"length": len(PROMPTS)} or sum(st["finished"].values()) == len(PROMPTS)
    assert max(st["batch"]) >= 2, st  # requests really shared calls
    if attention == "portable":
        assert any(T > 1 for (B, T) in pipe.engine.costs.seen if B > 1), pipe.engine.costs.seen


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_batched_first_prefill_chunks(bundles, attention):
    """Requests admitted together prefill their first chunks in one call (rows at n = 0, padded to the
    longest); a request admitted while others decode joins a run of free rows. Every output == solo."""
    pipe = specexport.load(bundles[attention])
    prompts = [(p * 4)[:40 + 6 * i] for i, p in enumerate(PROMPTS)]  # most prompts longer than one chunk (8): later chunks run single-row
    want = [solo(pipe, p, max_new_tokens=12) for p in prompts]
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    eng._thread = True  # drive the loop by hand: every request below is waiting at the first step
    cs = [pipe.submit(p, max_new_tokens=12, draft=d, k=k) for p, (d, k) in zip(prompts, DRAFTS)]
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == want
    assert sum(k * v for k, v in eng.counters["prefill_batch"].items()) >= 4, eng.counters  # >= 4 rows batched


def test_burst_short_prompts_decode_before_a_long_one_is_prefilled(bundles):
    """A burst's first chunks run together; whoever they completed decodes at the next step, while a long
    prompt goes on in budgeted chunks (it does not hold everyone's first token back). Outputs == solo."""
    pipe = specexport.load(bundles["fused"])
    prompts = ["hi there", "abc abc", "The quick brown fox jumps over the lazy dog. The quick brown fox"]
    want = [solo(pipe, p, max_new_tokens=10) for p in prompts]
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    eng._thread = True  # driven by hand
    cs = [pipe.submit(p, max_new_tokens=10) for p in prompts]
    eng.step()  # the first chunks of all three, one call: the two short prompts are done
    long = next(s for s in eng._active if s.c is cs[2])
    assert eng.counters["prefill_batch"] == {3: 1} and not long.prefilled
    eng.step()  # the short ones decode; the long one got one budgeted chunk
    assert all(c.generation.token_ids for c in cs[:2]) and not long.prefilled
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == want


def test_staggered_arrivals_and_cancel(bundles):
    pipe = specexport.load(bundles["portable"])
    want = {p: solo(pipe, p, max_new_tokens=30) for p in PROMPTS[:4]}
    pipe.start_engine(max_batch=2, max_queue=8)
    first = pipe.submit(PROMPTS[0], max_new_tokens=30, draft="recycle")
    doomed = pipe.submit(PROMPTS[1], max_new_tokens=30, draft="ngram")
    it = iter(first)
    next(it)  # the first is decoding: the next ones arrive at a later step
    late = [pipe.submit(p, max_new_tokens=30, draft="recycle", k="auto") for p in PROMPTS[2:4]]
    doomed.cancel()
    assert doomed.wait(30).finish_reason in ("cancelled", "length")
    for c, p in zip([first] + late, [PROMPTS[0]] + PROMPTS[2:4]):
        assert c.wait(60).token_ids == want[p]
    assert pipe.engine.stats()["running"] == 0 and len(pipe.engine.pool.free) == 2


@pytest.mark.parametrize("fixture", ["bundle_noisy", "bundle_portable"])
def test_draft_model_requests_match_solo(fixture, request):
    """draft="model" in the engine: the bundle's draft model drafts for every such request in shared calls
    (its own pool, one row per request); each request is identical to its solo run, greedy and Gumbel,
    beside requests with other drafts, and a cancelled one disturbs nobody."""
    pipe = specexport.load(request.getfixturevalue(fixture))
    drafts = ["model", "model", "recycle", "model", "none", "model"]
    for kw in ({}, dict(temperature=0.8, seed=3)):
        want = [solo(pipe, p, max_new_tokens=24, **kw) for p in PROMPTS]
        pipe.start_engine(max_batch=4, max_queue=8)
        doomed = pipe.submit(PROMPTS[0], max_new_tokens=40, draft="model", k=4, **kw)
        cs = [pipe.submit(p, max_new_tokens=24, draft=d, k="auto" if i == 5 else 2 if i % 2 else 4, **kw)
              for i, (p, d) in enumerate(zip(PROMPTS, drafts))]
        next(iter(doomed))
        doomed.cancel()
        got = [c.wait(60) for c in cs]
        assert [g.token_ids for g in got] == want
        assert doomed.wait(30).finish_reason in ("cancelled", "length")
        st = pipe.engine.stats()
        assert st["running"] == 0, st
        # on the fused bundle the model drafts only for a request alone or two verifying apart, which depends on
        # timing (test_draft_model_in_the_engine_drafts_as_solo checks the drafting itself); the portable graph's
        # B-row calls verify at any B, so the drafts of several requests always share calls there
        if fixture == "bundle_portable":
            assert any(B > 1 for B in st["draft_batch"]), st
    pipe.close(10)


def test_draft_model_in_the_engine_drafts_as_solo(bundle_noisy):
    """One request at a time, the engine's pooled draft proposes what the solo drafter does (same accepted and
    proposed counts per request): its cache follows every accept and rollback."""
    pipe = specexport.load(bundle_noisy)
    want = [pipe.generate(p, draft="model", k=4, max_new_tokens=24).stats for p in PROMPTS]
    pipe.start_engine(max_batch=1, max_queue=8)
    got = [c.wait(60).stats for c in [pipe.submit(p, draft="model", k=4, max_new_tokens=24) for p in PROMPTS]]
    assert [(s.accepted, s.proposed) for s in got] == [(s.accepted, s.proposed) for s in want]
    assert sum(s.accepted for s in got) > 0 and all(s.draft_s > 0 for s in got)
    pipe.close(10)


def priced_with_draft_spy(eng, verify_cost: float, batch_sizes) -> list:
    """Fix the engine's cost table at `batch_sizes` (a T = 1 call 1 s, a T > 1 call `verify_cost` s, a draft call
    0.01 s; no updates from the calls that run) and return the list that gets the decode step's B at each draft
    model call."""
    eng.costs.seen = {(B, T): 1.0 if T == 1 else verify_cost for B in batch_sizes for T in eng.target.profile_ts}
    eng.drafts.costs.seen = {(B, 1): 0.01 for B in batch_sizes}
    eng.costs.update = eng.drafts.costs.update = lambda *a: None
    rows, runs, decode, run = {}, [], eng._decode, eng.drafts.run
    eng._decode = lambda dec, ride=None: rows.update(B=eng.target.batch_for(max(s.row for s in dec) + 1)) or decode(dec, ride)
    eng.drafts.run = lambda pairs, *a: runs.append(rows["B"]) or run(pairs, *a)
    return runs


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_self_draft_reads_the_target_pool(ckpts, tmp_path, attention):
    """An int4 self-draft on the engine reads the target's pool (kv.SharedPool: no cache, prefill or catch-up
    of its own, as solo it reads the target's cache): alone it proposes exactly what the solo self-draft does,
    and beside other requests and drafts every request is its solo self, greedy and Gumbel; the target's
    committed lengths are the engine's own throughout."""
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], "self:int4", attention=attention,
                                        batch_sizes=(1, 2, 4)))
    want = [pipe.generate(p, draft="model", k=4, max_new_tokens=24).stats for p in PROMPTS]
    eng = pipe.start_engine(max_batch=1, max_queue=8)
    assert eng.drafts.shared and eng.drafts.pool.target is eng.pool
    got = [c.wait(60).stats for c in [pipe.submit(p, draft="model", k=4, max_new_tokens=24) for p in PROMPTS]]
    assert [(s.accepted, s.proposed) for s in got] == [(s.accepted, s.proposed) for s in want]
    assert sum(s.accepted for s in got) > 0
    pipe.close(10)
    drafts = ["model", "recycle", "model", "none", "model", "model"]
    for kw in ({}, dict(temperature=0.8, seed=3)):
        solo_ids = [solo(pipe, p, max_new_tokens=24, **kw) for p in PROMPTS]
        pipe.start_engine(max_batch=4, max_queue=8)
        cs = [pipe.submit(p, max_new_tokens=24, draft=d, k="auto" if i == 4 else 4, **kw)
              for i, (p, d) in enumerate(zip(PROMPTS, drafts))]
        assert [c.wait(60).token_ids for c in cs] == solo_ids
        st = pipe.engine.stats()
        assert any(B > 1 for B in st["draft_batch"]), st
        pipe.close(10)
    # where the guard acts (B >= 3; its pauses off here), k="auto" drafts nothing where not even every drafted
    # token accepted would beat a plain call (verify calls 8x a plain one, T <= 5: no tries either); with verify
    # calls priced cheap the steps at 4 rows draft
    if attention == "fused" and not pipe.target.kernel:
        return  # onnxruntime's own attention verifies nothing at B > 1: no drafts to choose (batch_ts)
    want = [solo(pipe, p, max_new_tokens=24) for p in PROMPTS[:4]]
    for verify_cost, few in ((8.0, True), (1.05, False)):  # 8x: not even 5 tokens a row would pay
        eng = pipe.start_engine(max_batch=4, max_queue=8)
        eng._thread = True  # driven by hand
        eng.payoff.allows = lambda B: True
        runs = priced_with_draft_spy(eng, verify_cost, (1, 2, 4))
        cs = [pipe.submit(p, max_new_tokens=24, draft="model", k="auto") for p in PROMPTS[:4]]
        while eng.step():
            pass
        assert [c.wait(1).token_ids for c in cs] == want
        assert eng.counters["batch"].get(4), eng.counters
        steps_at_4 = eng.counters["batch"][4]
        # 8x: no step drafts at 4 rows; cheap: every step drafts until the guard has measured 4 rows (steps with a
        # prompt riding along are not its), and most after
        assert (runs.count(4) == 0) if few else (runs.count(4) > steps_at_4 // 2), (runs, eng.counters)
        pipe.close(10)


def test_no_retry_of_its_own_at_more_rows(ckpts, tmp_path, monkeypatch):
    """Where the guard has measured speculation at some batch size (>= 3 rows) and even the best k would not pay,
    the other batch sizes of its built one draft nothing either, without a first try of their own (the fused
    graphs run every B, and a try at each cost a burst 8%, engine._spec_measured): three requests decode and
    draft once at 3 rows, a fourth arrives and the 4-row steps draft nothing (the retries after PROBE_STEPS
    priced-out steps left off: test_priced_out_drafts_are_retried_and_k_keeps_to_a_margin); the tokens are the
    solo ones. Verify calls 4x a plain one and every request's rate 0.5: priced out, though 5 tokens a row (rate 1)
    would pay, so the guard does try."""
    from specexport.runtime import engine as E

    monkeypatch.setattr(E, "PROBE_STEPS", 10 ** 6)
    monkeypatch.setattr(E.Sequence, "chain_rate", property(lambda s: 0.5))
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], "self:int4", attention="fused",
                                        batch_sizes=(1, 2, 4)))
    if not pipe.target.kernel:
        pytest.skip("onnxruntime's own attention verifies nothing at B > 1 (no C compiler for specexport's kernel)")
    prompts = PROMPTS[:4]
    want = [solo(pipe, p, max_new_tokens=24) for p in prompts]
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    eng._thread = True  # driven by hand
    eng.payoff.allows = lambda B: True
    runs = priced_with_draft_spy(eng, 4.0, (1, 2, 3, 4))
    cs = [pipe.submit(p, max_new_tokens=24, draft="model", k="auto") for p in prompts[:3]]
    while eng.counters["batch"].get(3, 0) < 4:
        assert eng.step()
    cs.append(pipe.submit(prompts[3], max_new_tokens=24, draft="model", k="auto"))
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == want
    assert eng.counters["batch"].get(4), eng.counters
    assert runs.count(3) >= 1 and runs.count(4) == 0, (runs, eng.counters)
    # a measurement at any B of a built batch size stands for all of its Bs (3..4 here), not for another's
    eng.payoff.steps = {4: 1}
    assert eng._spec_measured(3) and eng._spec_measured(4) and not eng._spec_measured(2)
    eng.payoff.steps = {2: 1}
    assert not eng._spec_measured(3)
    pipe.close(10)


def test_rate_fit_counts_what_chains_emitted_against_the_geometric_law(bundle_portable, monkeypatch):
    """Engine.rate_fit: per chain drafter, the tokens its verified chains emitted, what the geometric law at each
    request's running rate expected of them, the law's slope there and how many ran (undecayed here, so the sums
    are the requests' own stats); the offset it gives the rates is (emitted - expected) / slope once
    RATE_FIT_STEPS ran, 0 before. Tokens are the solo ones."""
    from specexport.runtime import engine as E
    from specexport.runtime.drafters import RowDraft

    monkeypatch.setattr(E, "RATE_FIT_DECAY", 1.0)
    pipe = specexport.load(bundle_portable)
    prompts = PROMPTS[:4]
    want = [solo(pipe, p, max_new_tokens=24) for p in prompts]
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    got = [c.wait(60) for c in [pipe.submit(p, max_new_tokens=24, draft="model", k=4) for p in prompts]]
    assert [g.token_ids for g in got] == want
    emitted, expected, slope, steps = eng.rate_fit[RowDraft]
    proposed = sum(g.stats.proposed for g in got)
    assert proposed / 4 <= steps <= proposed  # every verified chain: 1 to 4 drafted tokens
    assert emitted == sum(g.stats.accepted for g in got) + steps
    assert steps <= expected <= 5 * steps and slope > 0
    assert steps >= E.RATE_FIT_STEPS
    off = eng._rate_offset(RowDraft)
    assert off == pytest.approx(min(max((emitted - expected) / slope, -E.RATE_FIT_MAX), E.RATE_FIT_MAX))
    eng.rate_fit[RowDraft][3] = E.RATE_FIT_STEPS - 1  # too few chains yet: no offset
    assert eng._rate_offset(RowDraft) == 0.0
    pipe.close(10)


def auto_drafting(bundle):
    """An engine driven by hand with four k="auto" draft-model requests admitted and prefilled -> (pipe, engine,
    their completions, their Sequences, the verify profiles' T that their k allows)."""
    from specexport.runtime.drafters import RowDraft

    pipe = specexport.load(bundle)
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    eng._thread = True  # driven by hand: one step admits and prefills
    cs = [pipe.submit(p, max_new_tokens=8, draft="model", k="auto") for p in PROMPTS[:4]]
    eng.step()
    auto = [s for s in eng._active if isinstance(s.drafter, RowDraft)]
    assert auto
    ts = [k + 1 for k in eng.target.entry.verify_ks() if k <= min(s.cfg.k for s in auto)]
    return pipe, eng, cs, auto, ts


def test_choice_of_k_takes_the_rates_with_their_offset(bundle_portable):
    """k="auto" with the draft model: the k whose expected tokens per second of call and drafting is the most, the
    expectation the geometric law's at each request's running rate plus the drafter's offset (rate_fit). With
    each call priced at what the law expects at rate 0.8, rates of 0.75 take the shortest chain; the same rates
    with an offset of +0.1 the longest, at 4 rows and at 2."""
    from specexport.runtime import engine as E
    from specexport.runtime.costs import chain_tokens
    from specexport.runtime.drafters import RowDraft

    pipe, eng, cs, auto, ts = auto_drafting(bundle_portable)
    for s in auto:
        s.chain_hits, s.chain_tries = 0.75, 1.0
    assert len(ts) >= 2, ts
    eng.costs.seen = {(B, T): chain_tokens(0.8, T) for B in (1, 2, 3, 4) for T in [1] + ts}
    eng.drafts.costs.seen = {(B, 1): 1e-9 for B in (1, 2, 3, 4)}
    assert eng._model_k(auto, 4) == eng._model_k(auto, 2) == ts[0] - 1
    eng.rate_fit[RowDraft] = [11.0, 10.0, 10.0, E.RATE_FIT_STEPS]  # offset (11 - 10) / 10
    assert eng._rate_offset(RowDraft) == pytest.approx(0.1)
    assert eng._model_k(auto, 4) == eng._model_k(auto, 2) == ts[-1] - 1
    eng.rate_fit[RowDraft][3] = E.RATE_FIT_STEPS - 1  # too few chains yet: the rates alone
    assert eng._model_k(auto, 4) == ts[0] - 1
    for c in cs:
        c.cancel()
    pipe.close(10)


def test_gumbel_sampling_matches_solo(bundles):
    pipe = specexport.load(bundles["portable"])
    kw = dict(max_new_tokens=20, temperature=0.8, top_p=0.9, seed=7)
    want = [pipe.generate(p, draft="none", **kw).token_ids for p in PROMPTS[:4]]
    cs = [pipe.submit(p, draft=d, **kw) for p, d in zip(PROMPTS[:4], ["recycle", "ngram", "none", "recycle"])]
    assert [c.wait(60).token_ids for c in cs] == want


def test_rejection_sampler_law_in_a_batch(bundles):
    """Many batched requests (recycle drafts, rejection sampler): the first token (the prefill's) and the
    second (a verify call's, after the most frequent first token) follow the target's warped distribution:
    chi-square against the exact probabilities."""
    from scipy.stats import chisquare

    from specexport.runtime.prefill import feed
    from specexport.runtime.sampling import SamplingParams, probs, warp

    pipe = specexport.load(bundles["portable"])
    prompt = "abc abc abc ab"
    ids = pipe.encode(prompt)
    sp = SamplingParams(temperature=1.0, sampler="rejection", seed=0)

    def law(seq):
        cache = pipe.target.new_cache()
        feed(pipe.target, cache, seq[:-1])
        return probs(warp(pipe.target.step(cache, [seq[-1]], len(seq) - 1).logits[0], sp))

    def fits(got, p):
        top = np.argsort(p)[::-1][:6]
        obs = [int((got == t).sum()) for t in top] + [int((~np.isin(got, top)).sum())]
        exp = [p[t] * len(got) for t in top] + [(1 - p[top].sum()) * len(got)]
        return chisquare(obs, exp).pvalue > 1e-3, (obs, exp)

    pipe.start_engine(max_batch=4, max_queue=400)
    n = 400
    cs = [pipe.submit(prompt, max_new_tokens=3, temperature=1.0, sampler="rejection", seed=s, draft="recycle")
          for s in range(n)]
    gens = [c.wait(120) for c in cs]
    first = np.array([g.token_ids[0] for g in gens])
    ok, why = fits(first, law(ids))
    assert ok, why
    x1 = int(np.bincount(first).argmax())
    after = [g for g in gens if g.token_ids[0] == x1 and len(g.token_ids) > 1]
    assert sum(g.stats.accepted for g in after) < sum(g.stats.proposed for g in after)  # drafts were rejected
    assert sum(g.stats.accepted for g in after) > 0  # and accepted
    ok, why = fits(np.array([g.token_ids[1] for g in after]), law(ids + [x1]))
    assert ok, why


def test_refusals(bundles):
    pipe = specexport.load(bundles["fused"])
    with pytest.raises(PromptTooLong):
        pipe.submit("a" * 90, max_new_tokens=20)
    with pytest.raises(ValueError, match="no draft model"):
        pipe.submit("hi", draft="model")
    with pytest.raises(OptionError):
        pipe.start_engine(max_batch=16)
    pipe.start_engine(max_batch=1, max_queue=1)
    a = pipe.submit("hello", max_new_tokens=60)
    b = pipe.submit("hello", max_new_tokens=60)
    with pytest.raises(QueueFull):
        for _ in range(3):
            pipe.submit("hello", max_new_tokens=60)
    assert a.wait(60).finish_reason == "length" and b.wait(60).finish_reason == "length"
    assert pipe.close(10)


def test_stop_strings_cut_tokens_the_same_for_every_draft(bundles):
    """A stop string ends a request at the token that completes it, whichever draft ran (a verify step may
    accept tokens past it; they are not delivered), solo and batched alike."""
    pipe = specexport.load(bundles["portable"])
    prompt, full = max(((p, pipe.generate(p, max_new_tokens=30, draft="none").text) for p in PROMPTS),
                       key=lambda x: len(x[1]))
    assert len(full) >= 6, full
    stop = full[len(full) // 2:len(full) // 2 + 2]
    want = pipe.generate(prompt, max_new_tokens=30, draft="none", stop=(stop,))
    assert want.finish_reason == "stop" and want.text == full[:full.find(stop)]
    assert stop in pipe.tokenizer.decode(want.token_ids) and stop not in pipe.tokenizer.decode(want.token_ids[:-1])
    solo_runs = [pipe.generate(prompt, max_new_tokens=30, draft=d, k=4, stop=(stop,)) for d in ("ngram", "recycle")]
    cs = [pipe.submit(prompt, max_new_tokens=30, draft=d, stop=(stop,)) for d in ("none", "ngram", "recycle")]
    for g in solo_runs + [c.wait(60) for c in cs]:
        assert (g.text, g.token_ids, g.finish_reason) == (want.text, want.token_ids, "stop")
        assert g.stats.new_tokens == len(want.token_ids)


def test_generate_batch(bundles):
    from pathlib import Path

    pipe = specexport.load(bundles["fused"])
    assert Path(pipe.manifest.target.source["path"]).is_absolute()  # the torch backend reads it from any cwd
    want = [solo(pipe, p, max_new_tokens=12) for p in PROMPTS[:3]]
    assert [g.token_ids for g in pipe.generate_batch(PROMPTS[:3], max_new_tokens=12)] == want
    with pytest.raises(OptionError):
        pipe.generate_batch([])


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_warm_start_and_the_pool_buffer(bundles, attention):
    """start_engine runs every call shape first (nothing committed, the cost table seeded with each decode
    shape's time, measured at WARM_CACHED cached slots where the pool is fixed); a fused pool sits at the
    capacity from the start and is never reallocated while short and long requests come and go; a portable
    pool follows the longest row's bucket. Outputs == solo."""
    pipe = specexport.load(bundles[attention])
    prompts = ["hi", ("long prompt " * 20)[:70], "abc abc"]
    want = [solo(pipe, p, max_new_tokens=16) for p in prompts]
    seen_n, step_batch = set(), pipe.target.step_batch

    def recording(pool, ids, *args, **kw):  # the cache lengths the warm start's calls ran at, by T
        seen_n.add((ids.shape[1], int(pool.n[:ids.shape[0]].max())))
        return step_batch(pool, ids, *args, **kw)

    pipe.target.step_batch = recording
    eng = pipe.start_engine(max_batch=4)
    pipe.target.step_batch = step_batch
    # decode and verify calls priced at a request's length where the pool is fixed (WARM_CACHED, within the
    # capacity), prefill chunks at n = 0
    from specexport.runtime import engine as E

    cached = min(E.WARM_CACHED, eng.pool.buckets[-1] - max(pipe.target.profile_ts)) if eng.pool.fixed else 0
    assert (attention == "fused") == (cached > 0)
    decode = {t for name, t in pipe.target.entry.profiles.items() if not name.startswith("prefill")}
    assert {n for T, n in seen_n if T in decode} == {cached}, seen_n
    assert {n for T, n in seen_n if T not in decode} <= {0}, seen_n
    steps = {(B, T) for B in eng.batch_sizes for T in pipe.target.batch_ts(B) if T in (1, 2, 3, 5)}
    assert steps <= set(eng.costs.seen), (steps, eng.costs.seen)
    assert eng.counters["steps"] == 0 and not eng.pool.n.any() and len(eng.pool.free) == eng.pool.rows
    buf, S0 = eng.pool.data, eng.pool.S
    assert (S0 == 96) == (attention == "fused")  # 96: the test bundle's capacity
    got = [c.wait(60).token_ids for c in [pipe.submit(p, max_new_tokens=16, draft="none") for p in prompts]]
    assert got == want
    st, slot = eng.stats(), eng.pool.data[:, :, 0, :, 0].nbytes  # bytes of one slot of one row
    if attention == "fused":
        assert eng.pool.data is buf and eng.pool.generation == 0
        # resident: the slots the three rows were written up to (prompt - 1 + 16 each, at most), not 4 x 96
        # (a request moved to a lower row, `Engine._pack`, touches that row too: its slots count there as well)
        want_high = sorted(len(pipe.encode(p)) - 1 + 16 for p in prompts)
        high = sorted(eng.pool.high[eng.pool.high > 0])
        if st["row_moves"]:
            assert sum(high) >= sum(want_high) and max(high) <= max(want_high), (high, want_high)
        else:
            assert high == want_high
        assert st["pool_bytes"] == st["pool_peak_bytes"] == sum(high) * slot < eng.pool.data.nbytes
    else:
        assert eng.pool.generation > 0  # grew for the long prompt (and shrank after it)
    cold = pipe.start_engine(max_batch=4, warm=False)
    assert not cold.costs.seen


@pytest.mark.parametrize("kernel", ["1", "0"])
def test_mixed_calls_carry_prefill_chunks_and_verify_apart(bundles, kernel, monkeypatch):
    """A fused bundle's mixed graph: a request's later prefill chunks ride in the decode rows' call, and two
    decoding requests each verify their own draft: on specexport's attention kernel in one batched call of
    both rows, on onnxruntime's (which takes one token per row at B > 1) in one mixed call (the lower row as a
    batch of one, the other as a group). Outputs == solo, greedy and Gumbel sampling; the calls really ran
    (the engine's counters)."""
    monkeypatch.setenv("SPECEXPORT_KERNELS", kernel)
    pipe = specexport.load(bundles["fused"])
    assert bool(pipe.target.kernel) == (kernel == "1")
    assert pipe.target.groups == 1 and pipe.manifest.models["target"].mixed["max_abs"] <= 1e-4
    long = (PROMPTS[2] * 2)[:52]  # 6-7 chunks of 8: most of them ride in decode calls
    for kw in (dict(), dict(temperature=0.8, top_p=0.9, seed=3)):
        want = [pipe.generate(p, draft="none", max_new_tokens=n, **kw).token_ids for p, n in ((PROMPTS[1], 70), (long, 30))]
        eng = pipe.start_engine(max_batch=2, max_queue=4)
        eng._thread = True  # driven by hand: the long prompt arrives while the first request decodes
        first = pipe.submit(PROMPTS[1], max_new_tokens=70, draft="recycle", k=4, **kw)
        eng.step()
        eng.step()
        assert first.generation.token_ids and not first.done
        second = pipe.submit(long, max_new_tokens=30, draft="ngram", k=4, **kw)
        while eng.step():
            pass
        assert [c.wait(1).token_ids for c in (first, second)] == want
        st = eng.stats()
        verified = st["batch_verify"] if kernel == "1" else st["mixed_apart"]
        assert st["mixed_rides"] >= 3 and verified >= 3, st
        pipe.close()


def test_no_mixed_graph(ckpts, tmp_path):
    """--mixed-groups 0: no mixed graph in the bundle; the engine runs its plain calls, outputs == solo."""
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], ks=(2,), capacity=96, chunk=8,
                                        batch_sizes=(1, 2), mixed_groups=0))
    assert pipe.target.groups == 0 and not (pipe.root / "target.mixed.onnx").exists()
    want = [solo(pipe, p, max_new_tokens=16) for p in PROMPTS[:3]]
    cs = [pipe.submit(p, max_new_tokens=16, draft="recycle") for p in PROMPTS[:3]]
    assert [c.wait(60).token_ids for c in cs] == want


def test_two_groups_let_three_requests_verify_apart(ckpts, tmp_path, monkeypatch):
    """--mixed-groups 2: three decoding requests verify their own drafts in one call (a batch of one and two
    groups), a prefill chunk rides beside decode rows; every output == solo. (On onnxruntime's attention
    kernel: specexport's verifies the rows in one batched call instead.)"""
    monkeypatch.setenv("SPECEXPORT_KERNELS", "0")
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], ks=(2, 4), capacity=96, chunk=8,
                                        batch_sizes=(1, 2, 4), mixed_groups=2))
    assert pipe.target.groups == 2 and pipe.manifest.models["target"].mixed["max_abs"] <= 1e-4
    prompts = [PROMPTS[1], PROMPTS[4], PROMPTS[2]]
    want = [solo(pipe, p, max_new_tokens=40) for p in prompts]
    eng = pipe.start_engine(max_batch=4, max_queue=4)
    eng._thread = True
    cs = [pipe.submit(p, max_new_tokens=40, draft=d, k=4) for p, d in zip(prompts, ["recycle", "ngram", "recycle"])]
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == want
    assert eng.stats()["mixed_apart"] >= 3 and any(m == 3 for m, _ in eng.pair_costs.seen), eng.pair_costs.seen


def test_requests_at_the_capacity_share_calls(bundles):
    """Two requests whose prompt + max_new_tokens fill the capacity (96) exactly: their last steps cannot
    verify apart (no slots for the drafts), they decode plainly to the end; outputs == solo."""
    pipe = specexport.load(bundles["fused"])
    prompts = [(PROMPTS[1] * 4)[:40], (PROMPTS[4] * 4)[:30]]
    ids = [pipe.encode(p) for p in prompts]
    want = [pipe.generate(i, draft="none", max_new_tokens=96 - len(i)).token_ids for i in ids]
    cs = [pipe.submit(i, max_new_tokens=96 - len(i), draft="recycle", k=4) for i in ids]
    assert [c.wait(60).token_ids for c in cs] == want
    assert all(c.generation.finish_reason in ("length", "eos") for c in cs)
    # alone (a batch of one verifies): its last steps take only the T whose padding still fits the capacity
    for k in (4, "auto"):
        c = pipe.submit(ids[1], max_new_tokens=96 - len(ids[1]), draft="recycle", k=k)
        assert c.wait(60).token_ids == want[1] and c.generation.finish_reason in ("length", "eos"), c.error



def test_a_padding_row_near_the_capacity(bundle_portable):
    """A request whose prompt fills the cache up to 2 slots below the capacity sits on a row below a request
    verifying 5-token drafts: in the call that completes that prompt its row is padding, and T must fit its
    n + T too (the call covers it), or the call fails for both. Both == solo."""
    pipe = specexport.load(bundle_portable)
    d, p = pipe.encode(PROMPTS[1]), [5 + (i * 7) % 60 for i in range(94)]
    want = [solo(pipe, d, max_new_tokens=96 - len(d)), solo(pipe, p, max_new_tokens=2)]
    eng = pipe.start_engine(max_batch=3)
    eng._thread = True  # driven by hand: the long prompt takes row 0 once the first request left it
    first = pipe.submit(d, max_new_tokens=2, draft="none")
    cd = pipe.submit(d, max_new_tokens=96 - len(d), draft="model", k=4)
    while not first.done:
        eng.step()
    cp = pipe.submit(p, max_new_tokens=2, draft="none")
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in (cd, cp)] == want, (cd.error, cp.error)
    assert cd.generation.stats.accepted > 0


def test_a_padded_chunk_near_the_capacity_fits(bundle_noisy):
    """A prefill chunk's padding must fit the capacity: 4 tokens at n = 92 of 96 would be one padded 5-token
    call (the cheapest plan); only the profiles that fit are used (how the engine's draft rows catch up near
    the capacity). Same logits as feeding them one by one."""
    m = specexport.load(bundle_noisy).target
    ids = [5 + (i * 7) % 60 for i in range(96)]
    a, b = m.new_cache(), m.new_cache()
    prefill.feed(m, a, ids[:92])
    prefill.feed(m, b, ids[:92])
    got, _ = prefill.feed(m, a, ids[92:])
    for i in range(92, 96):
        out = m.step(b, [ids[i]], i)
        b.commit(out.new_kv, [0])
    assert a.n == b.n == 96
    np.testing.assert_allclose(got, out.logits[0], atol=1e-4)


def test_a_cancelled_waiting_request_frees_its_place(bundles):
    """With every row busy and the queue full, cancelling a waiting request frees its place at once: it
    finishes "cancelled" and the next submit is taken (not QueueFull until a row frees)."""
    pipe = specexport.load(bundles["fused"])
    pipe.start_engine(max_batch=1, max_queue=1)
    running = pipe.submit(PROMPTS[0], max_new_tokens=60, draft="none")
    next(iter(running))
    waiting = pipe.submit(PROMPTS[1], max_new_tokens=5)
    with pytest.raises(QueueFull):
        pipe.submit(PROMPTS[2], max_new_tokens=5)
    waiting.cancel()
    taken = pipe.submit(PROMPTS[2], max_new_tokens=5, draft="none")
    assert waiting.wait(1).finish_reason == "cancelled" and not running.done
    assert taken.wait(60).token_ids == solo(pipe, PROMPTS[2], max_new_tokens=5)
    pipe.close(10)



def test_a_drafter_that_raises_ends_its_request_alone(bundles, monkeypatch):
    """A request's drafter raising while the step builds its tree ends that request ("error", the exception
    kept); the request beside it in the same calls goes on, == solo."""
    from specexport.runtime.drafters.ngram import NgramDrafter

    def broken(self, tokens, k):
        raise RuntimeError("drafter fault")
    monkeypatch.setattr(NgramDrafter, "propose", broken)
    # portable: its B > 1 calls verify, so both draft every step; fused: two requests draft to verify apart (the
    # mixed graph), where the failure ends one of them before the call
    for attention in ("portable", "fused"):
        pipe = specexport.load(bundles[attention])
        want = solo(pipe, PROMPTS[2], max_new_tokens=20)
        pipe.start_engine(max_batch=2)
        bad, good = (pipe.submit(p, max_new_tokens=20, draft=d)
                     for p, d in ((PROMPTS[1], "ngram"), (PROMPTS[2], "none")))
        assert bad.wait(60).finish_reason == "error" and "drafter fault" in str(bad.error)
        assert good.wait(60).token_ids == want
        assert pipe.engine.stats()["running"] == 0 and len(pipe.engine.pool.free) == 2
        pipe.close(10)

def test_the_pool_shrinks_to_the_bucket_its_rows_need():
    """A bucketed pool moves down to the smallest bucket that holds twice what its rows need (and only down);
    a fixed one never moves."""
    pool = KVPool(1, 1, [32, 64, 128, 256], 2, rows=2)
    pool.reserve(200)
    assert pool.S == 256
    pool.n[0] = 9  # the engine's need is never below a row's n
    for need, S in ((150, 256), (100, 256), (60, 128), (40, 128), (10, 32)):
        pool.shrink(need)
        assert pool.S == S, (need, pool.S)
    fixed = KVPool(1, 1, [32, 256], 2, rows=2, fixed=True)
    fixed.shrink(1)
    assert fixed.S == 256

def test_calls_cover_the_busy_rows_only(bundles):
    """onnxruntime runs any B up to the largest built: 3 busy rows make a 3-row call, not a 4-row one. When the
    early finishers leave the low rows, the survivors move down (one copy of their cache each) and the calls
    shrink to them. Outputs == solo."""
    pipe = specexport.load(bundles["fused"])
    prompts, news = PROMPTS[:4], [3, 3, 28, 28]
    want = [solo(pipe, p, max_new_tokens=n) for p, n in zip(prompts, news)]
    eng = pipe.start_engine(max_batch=4)
    eng._thread = True  # driven by hand: all four are admitted at the first step, on rows 0-3
    cs = [pipe.submit(p, max_new_tokens=n, draft=d) for p, n, d in zip(prompts, news, ["none", "recycle"] * 2)]
    calls = []
    real = pipe.target.step_batch
    pipe.target.step_batch = lambda pool, ids, *a, **kw: calls.append(ids.shape[0]) or real(pool, ids, *a, **kw)
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == want
    assert eng.stats()["row_moves"] >= 2, eng.stats()
    # the first call: the four first prefill chunks; then rows 0-1 decode while 2-3 prefill, and once 0-1 are
    # done the survivors decode on rows 0-1 (on rows 2-3 every call would cover 3 or 4 rows)
    assert calls[0] == 4 and max(calls[1:]) <= 2, calls
    three = pipe.start_engine(max_batch=4)
    three._thread = True
    cs = [pipe.submit(p, max_new_tokens=6, draft="none") for p in prompts[:3]]
    calls.clear()
    while three.step():
        pass
    assert [c.wait(1).token_ids for c in cs] == [solo(pipe, p, max_new_tokens=6) for p in prompts[:3]]
    assert calls and set(calls) == {3}, calls  # the first chunks of the three, then their decode steps


@pytest.mark.parametrize("budget", [None, 8])
def test_the_default_budget_follows_the_prompts_waiting(bundles, budget):
    """While a request decodes, three prompts arrive: by default the step prefills a chunk of each (the budget
    is one chunk per request still prefilling, up to four), a fixed budget of one chunk feeds one. Outputs ==
    solo."""
    pipe = specexport.load(bundles["fused"])
    prompts = ["hi", *[(PROMPTS[2] * 2)[:60 + 5 * i] for i in range(3)]]
    want = [solo(pipe, p, max_new_tokens=12) for p in prompts]
    eng = pipe.start_engine(max_batch=4, prefill_budget=budget)
    eng._thread = True  # driven by hand
    first = pipe.submit(prompts[0], max_new_tokens=12)
    eng.step()
    assert first.generation.token_ids  # decoding
    cs = [pipe.submit(p, max_new_tokens=12) for p in prompts[1:]]
    eng.step()
    fed = sum(s.fed for s in eng._active if s.c in cs)
    assert (eng.prefill_budget, fed) == ((3 * eng.chunk, 3 * eng.chunk) if budget is None else (8, 8))
    while eng.step():
        pass
    assert [c.wait(1).token_ids for c in [first] + cs] == want


def test_payoff_pauses_speculation_that_delivers_less_than_plain():
    """runtime/costs.Payoff: a batch size whose steps that drafted deliver fewer tokens per row per second than a
    plain call (one token per row per plain call, timed in a run of plain calls), judged on their moving
    averages of tokens and of seconds once `settle` of them ran, decodes plain for `pause` steps, then tries
    again from nothing (each retry that falls behind again doubles the pause, one that pays resets it). One
    step that accepted nothing does not pause it; plain calls right after a speculative one (a change of shape)
    do not move the plain estimate; other batch sizes are not affected."""
    from specexport.runtime.costs import Payoff

    def behind(p, most):  # steps of ~1.1 tokens per row in 0.2 s (5.6 per second) until the guard pauses
        for i in range(most):
            p.record(8, 9, 9, 8, 0.200, plain_s=0.100)
            if not p.allows(8):
                return i + 1
        return None

    p = Payoff(pause=3, settle=4)
    p.record(8, 1, 8, 8, 0.100, plain_s=0.100)
    p.record(8, 1, 8, 8, 0.100, plain_s=0.100)  # a run of plain calls: 10 tokens per row per second
    for _ in range(4):  # 3 tokens per row in 0.2 s: 15 per second, pays
        p.record(8, 9, 24, 8, 0.200, plain_s=0.100)
    assert p.allows(8) and p.rate(8) == pytest.approx(15)
    p.record(8, 1, 8, 8, 0.500, plain_s=0.100)  # after a change of shape: not a plain call's cost
    assert p.plain[8] == pytest.approx(0.100)
    p.record(8, 9, 8, 8, 0.200, plain_s=0.100)  # a step that accepted nothing (5 per second) does not pause it
    assert p.allows(8)
    assert behind(p, 20) == 8  # the averages fall below Payoff.MARGIN (0.95) of 10 per second
    assert not p.allows(8) and p.allows(4)
    for _ in range(3):
        p.record(8, 1, 8, 8, 0.100, plain_s=0.100)
    assert p.allows(8) and not p.measured(8)  # paused 3 plain steps, then a fresh start
    for pause in (6, 12):  # retries that fall behind again: judged after `settle` steps, each pause twice the last
        assert behind(p, 20) == 4
        for _ in range(pause):
            assert not p.allows(8)
            p.record(8, 1, 8, 8, 0.100, plain_s=0.100)
        assert p.allows(8)
    for _ in range(4):  # a retry that pays: speculation goes on, the pause back to 3
        p.record(8, 9, 24, 8, 0.200, plain_s=0.100)
    assert p.allows(8)
    assert behind(p, 20) and p.plain_left[8] == 3  # falls behind later: paused for the first pause's length


def test_payoff_counts_the_drafting_of_steps_that_chose_plain():
    """A step that drafted pays its drafting whatever T it chose: steps that drafted and then ran T = 1 deliver
    one token per row per (call + drafting) seconds, below a plain call's rate, and pause speculation; the same
    calls without drafting (host 0) are plain steps and do not; the plain estimate is the calls' own time."""
    from specexport.runtime.costs import Payoff

    drafted, undrafted = Payoff(pause=3, settle=4), Payoff(pause=3, settle=4)
    for _ in range(4):
        drafted.record(8, 1, 8, 8, 0.100, plain_s=0.100, host=0.010)
        undrafted.record(8, 1, 8, 8, 0.100, plain_s=0.100)
    assert not drafted.allows(8) and undrafted.allows(8)
    assert drafted.plain[8] == pytest.approx(0.100) and drafted.rate(8) == pytest.approx(1 / 0.110)
    ok = Payoff(pause=3, settle=4)  # drafting that pays for itself: 2 tokens per row in 0.11 s
    for _ in range(4):
        ok.record(8, 5, 16, 8, 0.100, plain_s=0.100, host=0.010)
    assert ok.allows(8)
    level = Payoff(pause=3, settle=4)  # 0.97x plain: within the margin that plain's older price may be off by
    for _ in range(8):
        level.record(8, 1, 8, 8, 0.100, plain_s=0.100, host=0.003)
    assert level.allows(8) and level.rate(8) < 1 / level.plain[8]


def test_paused_engine_decodes_plain_and_the_same_tokens(bundles, monkeypatch):
    """While the guard pauses speculation at a batch size >= Payoff.MIN_ROWS (3), adaptive requests there run
    T = 1 calls (no tree drafted: its host work would be wasted) and get the tokens they get alone; calls of
    one or two rows are never paused (pausing there lost, costs.Payoff), so they keep drafting."""
    from specexport.runtime import engine as E
    from specexport.runtime.costs import Payoff
    from specexport.runtime.drafters.recycle import RecycleDrafter

    rows, drafted = {}, []  # the B of the decode step in progress; the B of every step that drafted a tree
    real_decode, real_draft = E.Engine._decode, RecycleDrafter.draft

    def decode(self, dec, ride=None):
        rows["B"] = self.target.batch_for(max(s.row for s in dec) + 1)
        return real_decode(self, dec, ride)
    monkeypatch.setattr(E.Engine, "_decode", decode)
    monkeypatch.setattr(RecycleDrafter, "draft", lambda self, *a: drafted.append(rows["B"]) or real_draft(self, *a))
    pipe = specexport.load(bundles["portable"])
    for level, prompts in ((4, PROMPTS[:4]), (2, PROMPTS[1:3])):
        want = [solo(pipe, p, max_new_tokens=16) for p in prompts]
        eng = pipe.start_engine(max_batch=level)
        eng._thread = True  # driven by hand
        eng.payoff.plain_left = {B: 10 ** 6 for B in range(1, 17)}  # paused wherever the guard acts
        cs = [pipe.submit(p, max_new_tokens=16, draft="recycle", k="auto") for p in prompts]
        drafted.clear()
        while eng.step():
            pass
        assert [c.wait(1).token_ids for c in cs] == want
        assert eng.counters["batch"].get(level), eng.counters
        if level >= Payoff.MIN_ROWS:  # paused: the steps of 4 rows drafted nothing
            assert all(b < Payoff.MIN_ROWS for b in drafted), (drafted, eng.counters)
        else:  # two rows: never paused, so the steps of 2 rows drafted
            assert drafted.count(2) >= eng.counters["batch"][2], (drafted, eng.counters)


def test_a_chain_priced_out_is_tried_again(bundles, monkeypatch):
    """A chain's running acceptance is measured only on steps that verify it: an adaptive ngram request whose
    rate fell to 0 (so plain decoding looked best) gets its drafts verified again later, its output unchanged;
    without the pull towards the prior it would never speculate again."""
    from specexport.runtime import engine as E

    pipe = specexport.load(bundles["fused"])
    prompt = "abc abc abc abc abc abc abc"
    want = solo(pipe, prompt, max_new_tokens=40)
    for pull, speculates in ((0.0, False), (E.CHAIN_PRIOR_PULL, True)):
        monkeypatch.setattr(E, "CHAIN_PRIOR_PULL", pull)
        eng = pipe.start_engine(max_batch=1)
        eng._thread = True  # drive the loop by hand
        # calls priced as on a real CPU (each extra row +10%), not by this tiny model's noisy timings
        eng.costs.seen = {(1, T): 1 + 0.1 * (T - 1) for T in pipe.target.profile_ts}
        eng.costs.update = lambda *a: None
        c = pipe.submit(prompt, max_new_tokens=40, draft="ngram", k="auto")
        eng.step()
        s = eng._active[0]
        s.chain_hits = 0.0  # no drafted token accepted in its 2 tries: rate 0
        while eng.step():
            pass
        g = c.wait(1)
        assert g.token_ids == want
        assert (g.stats.proposed > 0) == speculates, (pull, g.stats)


def test_a_draft_priced_out_is_tried_again(bundle_portable, monkeypatch):
    """k="auto" with the draft model where the guard acts (>= 3 rows): requests whose running rates price every
    k out (k = 0, no drafts) drift towards their drafter's pooled acceptance at every such step, as a chain
    offered and not verified does, so they draft again later; without the pull their rates stay frozen and
    they never draft at 3-4 rows (the engine's retries after PROBE_STEPS priced-out steps left off here). The
    tokens are the solo ones either way."""
    from specexport.runtime import engine as E
    from specexport.runtime.drafters import RowDraft

    pipe = specexport.load(bundle_portable)
    prompts = PROMPTS[:4]
    want = [solo(pipe, p, max_new_tokens=24) for p in prompts]
    monkeypatch.setattr(E, "PROBE_STEPS", 10 ** 6)
    for pull, drafts in ((0.0, False), (E.CHAIN_PRIOR_PULL, True)):
        monkeypatch.setattr(E, "CHAIN_PRIOR_PULL", pull)
        eng = pipe.start_engine(max_batch=4, max_queue=8)
        eng._thread = True  # driven by hand
        eng.payoff.allows = eng.payoff.measured = lambda B: True  # the guard has measured, never pauses
        runs = priced_with_draft_spy(eng, 1.3, (1, 2, 3, 4))  # a verify call 1.3x a plain one, drafts ~free
        eng.chains[RowDraft] = (0.1, 1.0)  # admitted at rate 0.1: 1 + 0.1 tokens for 1.3x the cost, k = 0
        cs = [pipe.submit(p, max_new_tokens=24, draft="model", k="auto") for p in prompts]
        eng.step()
        eng.chains[RowDraft] = (0.9, 1.0)  # the pooled acceptance they drift to
        while eng.step():
            pass
        assert [c.wait(1).token_ids for c in cs] == want
        assert any(B >= 3 for B in runs) == drafts, (pull, runs)
    pipe.close(10)


def test_a_first_try_waits_for_a_step_without_a_ride(bundle_portable):
    """At a guarded B not measured yet, where the prices say no k pays, a step that carries a riding prefill chunk
    drafts nothing (the guard measures only steps without one, so a try there would be tried again) and the next
    step without one tries; where they say one pays, and once measured, and below the guarded sizes, rides draft
    as other steps do. Where not even every drafted token accepted would pay, no step tries."""
    pipe, eng, cs, auto, ts = auto_drafting(bundle_portable)
    eng.drafts.costs.seen = {(B, 1): 1e-9 for B in (1, 2, 3, 4)}
    for s in auto:
        s.chain_hits, s.chain_tries = 0.3, 1.0
    # 2.5x a plain call: rate ~0.3 is priced out, though k + 1 tokens a row would pay; 8x: not even those
    for verify_cost, ride_k, tries in ((2.5, False, True), (1.0, True, True), (8.0, False, False)):
        eng.costs.seen = {(B, T): 1.0 if T == 1 else verify_cost for B in (1, 2, 3, 4) for T in [1] + ts}
        eng.payoff.steps = {}
        assert not eng._spec_measured(4)
        assert (eng._model_k(auto, 4, ride=True) > 0) == ride_k, verify_cost
        assert (eng._model_k(auto, 4) > 0) == tries, verify_cost  # the first try
        assert eng._model_k(auto, 2, ride=True) > 0  # below Payoff.MIN_ROWS nothing is guarded
    eng.costs.seen = {(B, T): 1.0 for B in (1, 2, 3, 4) for T in [1] + ts}
    eng.payoff.steps = {4: 1}
    assert eng._model_k(auto, 4, ride=True) > 0
    for c in cs:
        c.cancel()
    pipe.close(10)


def test_priced_out_drafts_are_retried_and_k_keeps_to_a_margin(bundle_portable):
    """Where every k is priced out at a guarded B (`_model_k` 0), the step after PROBE_STEPS such steps drafts
    the best k anyway (steps at any B of one built batch size counted together), so the draft calls, verify calls
    and rates that priced it out are measured again; a retry that is priced out again doubles the wait, one that
    is not resets it. Where the prices put drafting far below plain the first wait is the plain steps a retry
    loses over PROBE_LOSS. Between ks that pay, the choice leaves the k it chose last at that B only for one
    expected to deliver K_MARGIN more tokens per second."""
    from specexport.runtime import engine as E
    from specexport.runtime.costs import chain_tokens
    from specexport.runtime.drafters import RowDraft

    pipe, eng, cs, auto, ts = auto_drafting(bundle_portable)
    eng.payoff.measured = lambda B: True
    eng.drafts.costs.seen = {(B, 1): 1e-9 for B in (1, 2, 3, 4)}
    for s in auto:
        s.chain_hits, s.chain_tries = 0.1, 1.0  # expects ~1.1 tokens a row: priced out
    rate = min(max(auto[0].chain_rate + eng._rate_offset(RowDraft), 0.0), 1.0)
    longest = chain_tokens(rate, ts[-1])  # every verify call at one price: the longest chain is the best k
    for ratio in (0.97, 0.5):  # drafting's tokens per second over plain's: just below, far below
        eng.priced_out.clear()
        eng.costs.seen = {(4, 1): 1.0, **{(4, T): longest / ratio for T in ts}}
        # a retry loses 1 - ratio of its step, which is longest / ratio plain steps long
        wait = max(E.PROBE_STEPS, round((1 - ratio) * longest / ratio / E.PROBE_LOSS))
        ks = [eng._model_k(auto, 4) for _ in range(3 * wait)]
        first, second = wait - 1, 3 * wait - 1  # the retries: after `wait` steps, then after twice as many
        assert [i for i, k in enumerate(ks) if k] == [first, second], ratio
        assert ks[first] == ks[second] == ts[-1] - 1
    assert wait >= 100  # the far gap waited longer than PROBE_STEPS: 0.5 of a step of 2+ plain steps, over 0.01
    # the steps priced out at 3 rows and at 4 (one built batch size, --batch 1,2,4,8) count towards one wait
    eng.priced_out.clear()
    eng.costs.seen = {(B, T): 1.0 if T == 1 else longest / 0.97 for B in (3, 4) for T in [1] + ts}
    ks = [eng._model_k(auto, 3 + i % 2) for i in range(2 * E.PROBE_STEPS)]
    assert [i for i, k in enumerate(ks) if k] == [E.PROBE_STEPS - 1]
    for s in auto:
        s.chain_hits = 0.95  # now any k pays: the wait is reset
    assert eng._model_k(auto, 4) > 0 and 4 not in eng.priced_out
    # the margin: prices that make the next T ahead by less than K_MARGIN keep the last choice, more switch
    a, b = ts[0], ts[1]
    eng.last_T[4] = a
    rate = min(max(auto[0].chain_rate + eng._rate_offset(RowDraft), 0.0), 1.0)
    ratio = chain_tokens(rate, b) / chain_tokens(rate, a)  # cost(b) at this ratio: the two expect the same
    for ahead, want in ((1 + E.K_MARGIN / 2, a), (1 + 2 * E.K_MARGIN, b)):
        eng.last_T[4] = a
        eng.costs.seen = {(4, 1): 100.0, (4, a): 1.0, (4, b): ratio / ahead, **{(4, t): 100.0 for t in ts[2:]}}
        assert eng._model_k(auto, 4) == want - 1, (ahead, want)
    for c in cs:
        c.cancel()
    pipe.close(10)


def test_a_request_starts_from_its_drafters_acceptance(bundles):
    """A chain drafter's request is admitted with the acceptance that drafter's chains have had over the
    requests before it (0.5 before any), and what its own verified chains make goes into that pool; the
    tokens do not change."""
    from specexport.runtime.drafters.ngram import NgramDrafter

    pipe = specexport.load(bundles["fused"])
    prompt = "abc abc abc abc abc abc abc"
    want = solo(pipe, prompt, max_new_tokens=40)
    eng = pipe.start_engine(max_batch=1)
    eng._thread = True  # drive the loop by hand
    rates, proposed = [], 0
    for pool in (None, (0.2, 2.0), (1.8, 2.0)):
        if pool is not None:
            eng.chains[NgramDrafter] = pool
        c = pipe.submit(prompt, max_new_tokens=40, draft="ngram", k="auto")
        eng.step()
        rates.append(eng._active[0].chain_rate)
        tries = eng.chains.get(NgramDrafter, (0, 0))[1]
        while eng.step():
            pass
        g = c.wait(1)
        assert g.token_ids == want
        if g.stats.proposed:  # it verified chains: they went into the pool
            assert eng.chains[NgramDrafter][1] != tries
        proposed += g.stats.proposed
    assert rates == [0.5, 0.1, 0.9] and proposed


def test_auto_draft_stops_where_the_draft_is_unsure(ckpts, tmp_path):
    """k="auto" with a draft model at 1 row drafts up to CONFIDENT_K tokens a step, each request stopping once the
    chance that all its proposals are accepted (the product of their learnt Doubt chances) is no more than the bar
    the engine sets its row from the call costs: with every bar at 1 it drafts one token a step, with every bar
    below 0 its largest built k; with the engine's bars (positive, from the measured calls) it learns from every
    screened proposal the target judged. Every output is the request's solo one in each case."""
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], "self:int4", batch_sizes=(1, 2)))
    want = [solo(pipe, p, max_new_tokens=16) for p in PROMPTS[:2]]
    kmax = max(pipe.target.entry.verify_ks())
    for forced, check in ((1.0, lambda m: m == 1), (-1.0, lambda m: m == kmax), (None, None)):
        eng = pipe.start_engine(max_batch=1, max_queue=8)
        eng.drafts.stage = forced is None  # guesses fed: a row past its bar takes what its call scored (below)
        lens, run, judged, seen = [], eng.drafts.run, [], []
        tries = eng.drafts.doubt.tries.sum()

        def spy(pairs, bars):
            seen.extend(bars.values())
            spent = run(pairs, bars if forced is None else {r: forced for r in bars})
            lens.extend(len(s.drafter.props) for s, _ in pairs)
            return spent

        def spy_accepted(s, a, verified, accepted=eng.drafts.accepted):
            judged.append(min(verified, a + 1) if s.drafter.screened else 0)
            return accepted(s, a, verified)

        eng.drafts.run, eng.drafts.accepted = spy, spy_accepted
        cs = [pipe.submit(p, max_new_tokens=16, draft="model", k="auto") for p in PROMPTS[:2]]
        assert [c.wait(60).token_ids for c in cs] == want
        assert lens and (check is None or check(max(lens))), (forced, lens)
        assert seen and all(0 < b < float("inf") for b in seen), seen
        # the cells learnt each proposal the target judged
        assert sum(judged) > 0 and eng.drafts.doubt.tries.sum() - tries == sum(judged)
        pipe.close(10)


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_draft_calls_fed_guesses_propose_as_one_token_calls(ckpts, tmp_path, monkeypatch, attention):
    """A draft call may feed a proposing row guesses of its next proposals (PoolDrafts._guesses): every proposal is
    still the one a one-token call makes, so each step's proposals and every request's tokens are the same with
    guesses and without, at one row and at two; right guesses save calls (an oracle that knows the proposals: fewer
    calls than proposals), wrong ones none; prompt lookup and the draft's own successors save some here. Every call
    shape is priced alike, so the choice of how many to feed (`_stage`) feeds all a row has."""
    pipe = specexport.load(build_bundle(tmp_path / "b", ckpts["target"], "self:int4", attention=attention,
                                        batch_sizes=(1, 2)))
    want = [solo(pipe, p, max_new_tokens=24) for p in PROMPTS[:4]]
    oracle = {}  # a proposal's context (the request's tokens and the proposals before it) -> the proposal

    def knows(seq):  # a guesser that is always right where the context was seen
        return (oracle[tuple(seq)], ("lookup", 3), 0.99) if tuple(seq) in oracle else None

    def burst(rows, stage, guess=None):
        eng = pipe.start_engine(max_batch=rows, max_queue=8)
        eng.drafts.stage = stage
        if guess is not None:
            monkeypatch.setattr(eng.drafts, "_guess", guess)
        monkeypatch.setattr(eng.drafts.costs, "cost", lambda B, T: 1.0)  # every call shape priced alike
        props, run, calls = [], eng.drafts.run, []

        def spy(pairs, *a):
            before = sum(eng.drafts.calls.values())
            spent = run(pairs, *a)
            calls.append(sum(eng.drafts.calls.values()) - before)
            for s, _ in pairs:
                props.append(list(s.drafter.props))
                oracle.update({tuple(s.ids + s.drafter.props[:i]): t for i, t in enumerate(s.drafter.props)})
            return spent

        eng.drafts.run = spy
        cs = [pipe.submit(p, max_new_tokens=24, draft="model", k=4) for p in PROMPTS[:4]]
        assert [c.wait(60).token_ids for c in cs] == want
        pipe.close(10)
        return props, sum(calls), sum(map(len, props))

    for rows in (1, 2):
        one = burst(rows, False)
        assert one[2] > 0 and (one[1] == one[2] if rows == 1 else one[1] < one[2])  # one proposal a row a call
        right = burst(rows, True, knows)
        wrong = burst(rows, True, lambda seq: ((oracle[tuple(seq)] + 1) % pipe.target.vocab, ("table", 1), 0.99)
                      if tuple(seq) in oracle else None)
        real = burst(rows, True)
        assert right[0] == wrong[0] == real[0] == one[0]  # the same proposals, step by step
        assert right[1] * 5 < one[1] * 3 and wrong[1] == one[1] and real[1] < one[1], (right, wrong, real, one)
    # k="auto" at one row with every bar at 1 (past it after the first proposal): one call a step, and where the
    # call scored the next proposals (right guesses) the chain takes them, as no draft call pays for them
    eng = pipe.start_engine(max_batch=1, max_queue=8)
    monkeypatch.setattr(eng.drafts, "_guess", knows)
    monkeypatch.setattr(eng.drafts.costs, "cost", lambda B, T: 1.0)
    run, lens, calls = eng.drafts.run, [], []

    def one_bar(pairs, bars):
        before = sum(eng.drafts.calls.values())
        spent = run(pairs, {r: 1.0 for r in bars})
        calls.append(sum(eng.drafts.calls.values()) - before)
        lens.extend(len(s.drafter.props) for s, _ in pairs)
        return spent

    eng.drafts.run = one_bar
    cs = [pipe.submit(p, max_new_tokens=24, draft="model", k="auto") for p in PROMPTS[:4]]
    assert [c.wait(60).token_ids for c in cs] == want
    assert set(calls) == {1} and max(lens) > 1, (calls, lens)
    pipe.close(10)


def test_doubt_learns_what_the_target_accepted():
    """A Doubt cell's chance follows the verified proposals: accepted ones are hits, the first missed one a miss,
    those after a miss and those not verified are not counted; the cells come from probability and margin."""
    d = Doubt()
    sure = d.cell(np.array([9.0, 0.0, 0.0, 0.0], np.float32), 0)
    close = d.cell(np.array([1.0, 1.0, 0.0], np.float32), 0)
    assert sure == (4, 4) and close == (1, 0)  # p ~1 with a wide margin; p ~0.42 level with its runner-up
    start = d.chance(close)
    for _ in range(20):
        d.record([sure, close, sure, sure], a=1, verified=4)  # sure accepted, close missed, the rest not judged
    assert d.chance(close) < start / 5 and d.chance(sure) > 0.97
    assert d.tries[sure] == d.PRIOR + 20 and d.tries[close] == d.PRIOR + 20
    before = d.tries.copy()
    d.record([close, close], a=2, verified=1)  # only the first was verified: one hit
    assert d.tries.sum() == before.sum() + 1
