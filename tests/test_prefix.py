"""The engine's prefix cache (runtime/prefix.py): prompts' K/V kept for later requests that start the same way.

Lossless only if a row's K/V do not depend on the call that computed them: checked bit for bit (a prompt
prefilled whole against its prefix copied from another row and the rest prefilled), then end to end (requests
that hit the cache produce their solo tokens, with every kind of draft)."""
import numpy as np
import pytest

import specexport
from conftest import build_bundle
from specexport.errors import OptionError
from specexport.runtime.prefill import feed
from specexport.runtime.prefix import MIN_HIT, PrefixCache, exact

SYSTEM = "You are a terse assistant. Answer in one line, no lists, no code: "  # a shared system prompt
ASKS = ["hello there, general", "abc abc abc abc abc", "The quick brown fox jumps over", "1 2 3 4 5 6 7 8 9",
        "to be or not to be", "xyz"]


@pytest.fixture(scope="module")
def bundles(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("prefix")
    return {att: build_bundle(root / att, ckpts["target"], ks=(1, 2, 4), capacity=128, chunk=8, attention=att,
                              batch_sizes=(1, 2, 4)) for att in ("fused", "portable")}


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_a_copied_prefix_gives_the_bits_of_a_whole_prefill_where_the_engine_keeps_one(bundles, attention):
    """The fused graph (specexport's kernels) gives a row the same bits whatever call computed its prefix; the
    portable graph's attention (plain ops over the bucket) does not, and `exact` (the engine's check at start)
    says which."""
    pipe = specexport.load(bundles[attention])
    t = pipe.target
    pool = t.new_pool(2)
    same = True
    for ids in (pipe.encode(SYSTEM + a) for a in ASKS[:3]):
        for P in (MIN_HIT, 21, len(ids) - 1):
            pool.n[:] = 0
            pool.reserve(len(ids))
            whole, _ = feed(t, pool.row(0), ids)
            pool.load_prefix(1, pool.data[:, :, 0], P)
            rest, _ = feed(t, pool.row(1), ids[P:])
            assert pool.n[1] == len(ids)
            assert np.abs(whole - rest).max() < 1e-4  # the same prompt either way, within float32 rounding
            same = same and np.array_equal(whole, rest) and np.array_equal(pool.data[:, :, 0, :, :len(ids)],
                                                                            pool.data[:, :, 1, :, :len(ids)])
    assert exact(t, t.entry.profiles["prefill"]) == same
    assert same or attention == "portable"
    assert (pipe.start_engine(max_batch=2, warm=False).prefixes is not None) == same


def _solo(pipe, prompts, **kw):
    return [pipe.generate(p, max_new_tokens=16, draft="none", **kw).token_ids for p in prompts]


@pytest.mark.parametrize("attention", ["fused", "portable"])
def test_requests_with_a_shared_prefix_match_solo(bundles, attention):
    """The first request prefills SYSTEM + its question and is kept; the later ones (arriving while it and each
    other decode, with every draft) take the shared part from the cache and produce their solo tokens."""
    pipe = specexport.load(bundles[attention])
    prompts = [SYSTEM + a for a in ASKS]
    want = _solo(pipe, prompts)
    eng = pipe.start_engine(max_batch=4, max_queue=8)
    first = pipe.submit(prompts[0], max_new_tokens=16, draft="none")
    first = first.wait(60)
    drafts = [("none", None), ("ngram", 4), ("recycle", None), ("recycle", 4), ("ngram", "auto")]
    cs = [pipe.submit(p, max_new_tokens=16, draft=d, k=k) for p, (d, k) in zip(prompts[1:], drafts)]
    got = [first.token_ids] + [c.wait(60).token_ids for c in cs]
    assert got == want
    if eng.prefixes is None:  # the portable graph: off (the test above), every prompt prefilled whole
        assert attention == "portable" and not any(c.generation.stats.cached_tokens for c in cs)
        return
    shared = len(pipe.encode(SYSTEM)) - 1  # the last character's token merges with nothing here: at least this
    cached = [c.generation.stats.cached_tokens for c in cs]
    assert all(n >= shared for n in cached), cached
    st = eng.stats()["prefix_cache"]
    assert st["hits"] >= len(cs) and st["hit_tokens"] == sum(cached) + first.stats.cached_tokens
    assert 0 < st["bytes"] <= st["budget"]


def test_the_self_draft_and_a_draft_model_after_a_hit(ckpts, bundle_noisy, tmp_path):
    """A draft model with a pool of its own catches up on the prompt itself; a self-draft reads the target's
    rows, the copied prefix included. Both produce the solo tokens after a hit."""
    selfd = build_bundle(tmp_path / "self", ckpts["target"], "self:int8", ks=(1, 2, 4), capacity=128, chunk=8,
                         batch_sizes=(1, 2, 4))
    for path in (bundle_noisy, selfd):
        pipe = specexport.load(path)
        prompts = [SYSTEM[:30] + a for a in ASKS[:4]]  # bundle_noisy holds 96 tokens
        want = _solo(pipe, prompts)
        pipe.start_engine(max_batch=4, max_queue=8)
        got = [pipe.submit(prompts[0], max_new_tokens=16, draft="model", k=2).wait(60).token_ids]
        cs = [pipe.submit(p, max_new_tokens=16, draft="model", k=k) for p, k in zip(prompts[1:], (2, 4, "auto"))]
        got += [c.wait(60).token_ids for c in cs]
        assert got == want, path
        assert all(c.generation.stats.cached_tokens >= MIN_HIT for c in cs)


def test_a_next_turn_takes_the_last_turns_answer_from_the_cache(bundles):
    pipe = specexport.load(bundles["fused"])
    pipe.start_engine(max_batch=2)
    one = pipe.submit([{"role": "user", "content": ASKS[0] + " " + ASKS[4]}], max_new_tokens=20,
                      draft="none").wait(60)
    # the next turn as token ids: this random model's answer holds ids that the tokenizer does not give back
    turn2 = one.prompt_ids + one.token_ids + pipe.encode("<user>and then?")
    two = pipe.submit(turn2, max_new_tokens=8, draft="none").wait(60)
    # kept when the first request ended: its prompt and its answer but the last token (never fed)
    assert two.stats.cached_tokens == len(one.prompt_ids) + len(one.token_ids) - 1
    assert two.token_ids == pipe.generate(turn2, max_new_tokens=8, draft="none").token_ids


def test_off_and_bad_sizes(bundles):
    pipe = specexport.load(bundles["fused"])
    eng = pipe.start_engine(max_batch=2, prefix_cache_mb=0)
    assert eng.prefixes is None and eng.stats()["prefix_cache"] is None
    c = pipe.submit(SYSTEM + ASKS[0], max_new_tokens=4, draft="none")
    c.wait(60)
    c = pipe.submit(SYSTEM + ASKS[1], max_new_tokens=4, draft="none")
    assert c.wait(60).stats.cached_tokens == 0
    for bad in (-1, float("nan"), "64", True):
        with pytest.raises(OptionError, match="prefix_cache_mb"):
            pipe.start_engine(prefix_cache_mb=bad)


def test_the_chat_preamble_is_cached_at_start(bundles):
    pipe = specexport.load(bundles["fused"])
    pre = pipe.chat_preamble()
    assert pre and pre == pipe.encode([{"role": "user", "content": "zzz"}])[:len(pre)]
    eng = pipe.start_engine(max_batch=2)
    # the tiny template's preamble ("<user>") is shorter than a hit is worth: nothing kept
    assert len(pre) < MIN_HIT and eng.prefixes.stats()["entries"] == 0
    eng.cache_prefix(pipe.encode(SYSTEM))  # a service's own system prompt
    assert eng.prefixes.stats()["entries"] == 1
    g = pipe.submit(SYSTEM + ASKS[2], max_new_tokens=8, draft="none").wait(60)
    assert g.stats.cached_tokens >= len(pipe.encode(SYSTEM)) - 1
    assert g.token_ids == pipe.generate(SYSTEM + ASKS[2], max_new_tokens=8, draft="none").token_ids


def test_cache_keeps_to_its_budget_in_a_ring_oldest_out():
    row = np.zeros((1, 2, 1, 8, 4), np.float32)  # a pool row's shape: 32 bytes a token
    c = PrefixCache(budget_bytes=32 * 60 + 31, row=row)
    assert c.slots == 60 and c.budget == 32 * 60
    src = np.arange(2 * 4 * 70, dtype=np.float32).reshape(1, 2, 1, 70, 4)  # each token's K/V told apart
    a, b = list(range(100, 130)), list(range(200, 225))
    c.insert(a, src)
    c.insert(b, src)
    assert c.stats()["entries"] == 2 and c.bytes == 32 * 55
    P, kv = c.lookup(a[:20] + [7, 8])  # the longest common prefix, with any entry
    assert P == 20 and np.array_equal(kv, src[:, :, :, :20])
    assert c.lookup(a)[0] == 29  # never the whole prompt: its last token's logits give the first token
    assert c.lookup(a[:MIN_HIT - 1] + [1, 2, 3])[0] == 0  # too short to be worth it
    c.insert(a + [1] * 10, src)  # extends a (dropped for it); no room after b: slot 0 on, over a's and b's
    assert c.stats()["entries"] == 1 and c.bytes == 32 * 40 and c.lookup(b)[0] == 0
    P, kv = c.lookup(a + [1] * 10 + [5])
    assert P == 40 and np.array_equal(kv, src[:, :, :, :40])
    c.insert(a[:20], src)  # held already (a prefix of an entry)
    assert c.stats()["entries"] == 1
    c.insert(list(range(61)), src)  # more slots than the ring has: not kept, nothing evicted
    assert c.stats()["entries"] == 1
    c.insert(b, src)  # after the 40: slots 40-64 pass the end, so 0-24, over the 40's
    assert list(c.entries) == [0] and c.lookup(b)[0] == 24 and c.lookup(a + [1] * 10)[0] == 0
