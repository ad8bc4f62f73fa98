"""Lossless greedy decoding, rollback, reproducible sampling, concurrency: the runtime's core promises."""
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

import specexport

PROMPTS = ["hello world, hello world", "the cat sat on the mat. the cat", "abc abc abc", "Q: 12+7? A:",
           "to be or not to be"]


@pytest.fixture(scope="module")
def pipe(bundle_noisy):
    return specexport.load(bundle_noisy)


def hf_greedy(ckpt, ids, n):
    m = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        x = torch.tensor([ids])  # an explicit mask: transformers would otherwise mask <unk> (= pad id 0)
        out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("k", [1, 2, 4, "auto"])
def test_greedy_speculative_equals_plain_and_transformers(pipe, ckpts, k):
    accepted = rejected = tree_accepted = tree_rejected = 0
    for prompt in PROMPTS:
        ids = pipe.encode(prompt)
        want = hf_greedy(ckpts["target"], ids, 40)
        plain = pipe.generate(prompt, max_new_tokens=40, draft="none")
        spec = pipe.generate(prompt, max_new_tokens=40, draft="model", k=k)
        ngram = pipe.generate(prompt, max_new_tokens=40, draft="ngram", k=k)
        tree = pipe.generate(prompt, max_new_tokens=40, draft="recycle", k=k)
        assert plain.token_ids == want
        assert spec.token_ids == want
        assert ngram.token_ids == want
        assert tree.token_ids == want
        accepted += spec.stats.accepted
        rejected += spec.stats.proposed - spec.stats.accepted
        tree_accepted += tree.stats.accepted
        tree_rejected += tree.stats.proposed - tree.stats.accepted
    assert accepted > 0 and rejected > 0, "the draft must be sometimes right and sometimes wrong"
    assert tree_accepted > 0 and tree_rejected > 0


@pytest.mark.parametrize("draft", ["model", "recycle"])
def test_rollback_continuation_equals_fresh_run(pipe, draft):
    """After rejections, the state equals a fresh run over the accepted text: continuing from the
    speculative output gives exactly what a fresh generation over prompt + that output gives. For the tree
    drafter the committed rows are a path through the tree, not a prefix of the call."""
    ids = pipe.encode(PROMPTS[1])
    first = pipe.generate(ids, max_new_tokens=20, draft=draft, k=4)
    assert first.stats.proposed > first.stats.accepted  # there were rejections
    whole = pipe.generate(ids, max_new_tokens=35, draft=draft, k=4)
    cont = pipe.generate(ids + first.token_ids, max_new_tokens=15, draft="none")
    assert whole.token_ids == first.token_ids + cont.token_ids


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_seeded_sampling_same_text_with_any_draft(pipe, seed):
    opts = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=40, seed=seed)
    none = pipe.generate(PROMPTS[0], draft="none", **opts).token_ids
    for draft, k in [("model", 1), ("model", 4), ("ngram", 2), ("ngram", 4), ("recycle", 4)]:
        assert pipe.generate(PROMPTS[0], draft=draft, k=k, **opts).token_ids == none, (draft, k)
    other = pipe.generate(PROMPTS[0], draft="none", **{**opts, "seed": seed + 100}).token_ids
    assert other != none  # the seed matters


def test_concurrent_generations_match_sequential(pipe):
    jobs = [(p, d) for p in PROMPTS for d in ("model", "ngram", "recycle", "none")]
    alone = {j: pipe.generate(j[0], max_new_tokens=25, draft=j[1], k=2).token_ids for j in jobs}
    together = {}

    def run(j):
        together[j] = pipe.generate(j[0], max_new_tokens=25, draft=j[1], k=2).token_ids

    threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_streaming_pieces_add_up_and_stop_strings(pipe):
    from specexport.runtime import Generation

    g = Generation()
    pieces = list(pipe.stream(PROMPTS[2], max_new_tokens=30, draft="ngram", k=4, result=g))
    assert "".join(pieces) == g.text and len(pieces) > 1
    full = pipe.generate(PROMPTS[2], max_new_tokens=30, draft="ngram", k=4).text
    stop = full[5:7]
    cut = pipe.generate(PROMPTS[2], max_new_tokens=30, draft="ngram", k=4, stop=(stop,))
    assert cut.finish_reason == "stop" and cut.text == full[:full.find(stop)]
    assert "".join(pipe.stream(PROMPTS[2], max_new_tokens=30, draft="ngram", k=4, stop=(stop,))) == cut.text


def test_chat_template_renders_like_transformers(pipe, ckpts):
    from transformers import AutoTokenizer

    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    want = AutoTokenizer.from_pretrained(ckpts["target"]).apply_chat_template(msgs, add_generation_prompt=True,
                                                                              tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert pipe.encode(msgs) == list(want)


def test_long_prefill_profiles_fewer_calls_same_tokens(ckpts, tmp_path, monkeypatch):
    """--long-prefill: the bundle carries prefill_<T> profiles, parity-checked like the others; a prompt that
    prefills alone takes them (fewer calls), solo and through an idle engine, and the tokens stay those of
    transformers' greedy decoding; on specexport's kernels (any T) alone it takes up to ALONE_CHUNK tokens a
    call, past the profiles, the LM head on the last call only; while another request decodes, the engine's
    chunks stay within its budget."""
    from conftest import build_bundle
    from specexport.runtime import prefill

    b = build_bundle(tmp_path / "long", ckpts["target"], capacity=128, long_prefill=(16, 32))
    pipe = specexport.load(b)
    assert pipe.target.entry.profiles == {"decode": 1, "prefill": 8, "prefill_16": 16, "prefill_32": 32,
                                          "verify_1": 2, "verify_2": 3, "verify_4": 5}
    assert {"prefill_16", "prefill_32"} <= set(pipe.target.entry.parity)
    ids = pipe.encode(" ".join(PROMPTS * 3))[:75]
    want = hf_greedy(ckpts["target"], ids, 20)
    calls, heads = [], []
    step = pipe.target.step
    pipe.target.step = lambda cache, x, *a, **k: calls.append(len(x)) or heads.append(k.get("rows")) or step(
        cache, x, *a, **k)
    if pipe.target.any_t:  # alone, on the kernels: the 75 ids in one call
        assert pipe.generate(ids, max_new_tokens=20, draft="none").token_ids == want
        assert calls[0] == 75 and heads[0] == [74] and sum(t > 1 for t in calls) == 1
        monkeypatch.setattr(prefill, "ALONE_CHUNK", 0)  # the profiles' largest again
        calls.clear(), heads.clear()
    assert pipe.generate(ids, max_new_tokens=20, draft="none").token_ids == want
    assert calls[:2] == [32, 32] and sum(t > 1 for t in calls) == 3  # 75 prompt ids in 3 calls (8-token: 10)
    assert heads[:3] == [[], [], [10]]  # logits of the prompt's last id (its 11th of the last call) only
    # the last 11: on specexport's kernels (any T) one unpadded call, else the 16 profile with 5 pad rows
    assert calls[2] == (11 if pipe.target.any_t else 16)
    any_t, pipe.target.any_t = pipe.target.any_t, False  # the profiles' plan, as where the kernels do not run
    pipe.target.call_cost = 0  # a backend's own price of a call, in prompt tokens: free calls, no padding
    calls.clear()
    assert pipe.generate(ids, max_new_tokens=20, draft="none").token_ids == want
    assert calls[:4] == [32, 32, 8, 3]  # the last 11 ids as 8 + 3 instead of 16 with 5 pad rows
    del pipe.target.call_cost
    pipe.target.any_t = any_t
    assert pipe.generate(ids, max_new_tokens=20, draft="recycle", k=4).token_ids == want
    eng = pipe.start_engine(max_batch=2)
    eng._thread = True  # driven by hand: the second request arrives while the first decodes
    calls.clear()
    alone = pipe.submit(ids, max_new_tokens=20)
    while eng.step():
        pass
    assert alone.wait(1).token_ids == want and 32 in calls  # alone: the long profiles
    short = pipe.encode(PROMPTS[0])
    first = pipe.submit(short, max_new_tokens=40)
    while not (eng._active and eng._active[0].prefilled):
        eng.step()
    calls.clear()
    mixed = pipe.target.step_mixed  # a chunk that rides in the decode call is a group of the mixed graph
    pipe.target.step_mixed = lambda pool, i, p, m, g, **k: calls.extend(len(x[1]) for x in g) or mixed(pool, i, p, m, g, **k)
    late = pipe.submit(ids, max_new_tokens=20)
    while eng.step():
        pass
    assert late.wait(1).token_ids == want and first.wait(1).token_ids == hf_greedy(ckpts["target"], short, 40)
    assert calls and max(calls) <= 8  # while another decodes: chunks within the budget (8 tokens)


def test_batch_parity_at_the_engines_largest_call(ckpts, tmp_path):
    """A portable bundle with batch sizes and long prefill profiles: the build's B > 1 parity check runs the
    largest T the engine calls B rows with (the 8-token prefill chunk here, above the verify T = 5), not a
    long prefill profile, which only one row at a time runs."""
    import json

    from conftest import build_bundle

    b = build_bundle(tmp_path / "pb", ckpts["target"], capacity=128, long_prefill=(16, 32), attention="portable",
                     batch_sizes=(1, 2))
    t = json.loads((b / "manifest.json").read_text())["models"]["target"]
    assert "prefill_32" in t["profiles"] and set(t["parity"]) - set(t["profiles"]) == {"decode@capacity",
                                                                                       "batch_B2_T8"}
    r = t["parity"]["batch_B2_T8"]
    assert len(set(r["cache_lengths"])) == 2 and r["max_abs"] < 1e-4 and r["top1"] == 1.0


def test_a_tree_near_the_capacity_takes_a_t_that_fits(pipe, monkeypatch):
    """A prompt + max_new_tokens that fill the bundle exactly, recycle's trees verified at the largest T the
    step may take: every node takes a slot, so near the end the step takes a smaller T, never one past the
    capacity (a 32-token prompt drew T = 5 at 92 cached of 96); the tokens are plain decoding's."""
    from specexport.runtime.costs import StepCosts

    prompt = "the cat sat on the mat. the cat"
    n = pipe.manifest.capacity - len(pipe.encode(prompt))
    want = pipe.generate(prompt, max_new_tokens=n, draft="none").token_ids
    monkeypatch.setattr(StepCosts, "best", lambda self, B, ts, expected: max(ts))
    got = pipe.generate(prompt, max_new_tokens=n, draft="recycle", k=4)
    assert got.token_ids == want and got.stats.accepted > 0
