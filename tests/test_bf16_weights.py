"""bfloat16 weights (backend "onnxruntime-bf16"): specexport's MatMul kernel rounds each weight to bfloat16 when it
packs it and multiplies in float32. At the op: exactly the float32 kernel's chain over the rounded weights, rounded
as torch rounds to bfloat16. In a bundle: a target of its own, greedy-identical to transformers' eager model with
its Linear weights rounded the same way, and every drafter lossless against its own plain decoding, solo and
batched, greedy and seeded sampling."""
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import specexport
from specexport import kernels
from specexport.errors import OptionError
from test_matmul_kernel import fma_chain, session
from test_lossless import PROMPTS


def bf16(W: np.ndarray) -> np.ndarray:
    """W rounded to bfloat16 (to nearest, ties to even), back in float32."""
    u = W.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.fixture(autouse=True)
def need_kernels():
    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): bfloat16 weights live in specexport's kernels")


def test_rounding_is_torchs():
    rng = np.random.default_rng(0)
    W = np.concatenate([rng.standard_normal(5000, dtype=np.float32) * 10.0 ** rng.integers(-20, 20, 5000),
                        np.array([0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, 3.4e38, -1e-40], np.float32)]).astype(np.float32)
    want = torch.from_numpy(W).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(bf16(W), want)


@pytest.mark.parametrize("K,N", [(40, 17), (96, 130), (33, 197), (600, 70)])
def test_bf16_matmul_is_the_chain_over_rounded_weights(tmp_path, K, N):
    """Bit for bit the float32 kernel's chain over the weights rounded to bfloat16, whatever rows share the call;
    and not the float32 result (the weights really are rounded)."""
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((K, N), dtype=np.float32)
    s = session(tmp_path, W, [1, "M", K], weights="bf16")
    for M in (1, 6, 7, 40):
        x = rng.standard_normal((1, M, K), dtype=np.float32)
        y = s.run(None, {"A": x})[0]
        np.testing.assert_array_equal(y[0], fma_chain(x[0], bf16(W)))
        assert np.abs(y[0] - fma_chain(x[0], W)).max() > 1e-4
    one = s.run(None, {"A": x[:, 5:6]})[0]
    np.testing.assert_array_equal(one[0, 0], y[0, 5])  # a row alone = the same row among 40


@pytest.mark.parametrize("amx", ["1", "0"])
@pytest.mark.parametrize("K,N", [(41, 17), (96, 130), (601, 70)])
def test_bf16_dot_rows_do_not_depend_on_their_call(tmp_path, monkeypatch, K, N, amx):
    """The dot-product format (weights and activations rounded to bfloat16, products summed in pairs by
    VDPBF16PS, or by AMX tiles where the CPU has them): close to the float64 product of the rounded operands, not
    the weight-only result, and a row's bits do not depend on the rows that share its call (K odd: the last
    pair's high half is 0; 40 rows: AMX's 16-row tiles, the last one partly zero rows)."""
    lib = kernels.library(64)
    if not kernels.matmul_dot(lib):
        pytest.skip("this CPU has no avx512_bf16 (VDPBF16PS): the bf16dot format is not built")
    monkeypatch.setenv("SPECEXPORT_AMX", amx)
    if amx == "1" and not kernels.matmul_amx(lib):
        pytest.skip("no AMX here (amx_bf16, or Linux's grant of the tiles): bf16dot runs on VDPBF16PS")
    rng = np.random.default_rng(K * N)
    W = rng.standard_normal((K, N), dtype=np.float32)
    s = session(tmp_path, W, [1, "M", K], weights="bf16dot")
    x = rng.standard_normal((1, 40, K), dtype=np.float32)
    y = s.run(None, {"A": x})[0][0]
    exact = bf16(x[0]).astype(np.float64) @ bf16(W).astype(np.float64)
    assert np.abs(y - exact).max() < 1e-4 * K
    assert np.abs(y - fma_chain(x[0], bf16(W))).max() > 1e-3  # the activations are rounded too
    for lo, M in ((0, 1), (39, 1), (3, 7), (20, 13)):
        np.testing.assert_array_equal(s.run(None, {"A": x[:, lo:lo + M]})[0][0], y[lo:lo + M])


def hf_bf16_greedy(ckpt, ids, n):
    """transformers' eager model with every Linear weight (the LM head's too, untied) rounded to bfloat16,
    float32 math: what the bfloat16-weight target computes."""
    m = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(mod.weight.to(torch.bfloat16).float())
        x = torch.tensor([ids])
        out = m.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def pipe(bundle_noisy):
    return specexport.load(bundle_noisy, backend="onnxruntime-bf16")


@pytest.fixture(scope="module", params=["onnxruntime-bf16", "onnxruntime-bf16dot"])
def any_bf16(request, bundle_noisy):
    if request.param.endswith("dot") and not kernels.matmul_dot(kernels.library(16)):
        pytest.skip("this CPU has no avx512_bf16 (VDPBF16PS): backend onnxruntime-bf16dot is refused here")
    return specexport.load(bundle_noisy, backend=request.param)


def test_bf16_target_is_transformers_with_rounded_weights(pipe, ckpts):
    e = pipe.target.entry
    assert pipe.target.weights == "bf16" and "bfloat16 weights" in pipe.target.numerics
    assert e.speculative and e.verify_drift <= e.parity_tolerance  # measured at load, on these weights
    for p in PROMPTS:
        ids = pipe.encode(p)
        assert pipe.generate(p, max_new_tokens=40, draft="none").token_ids == hf_bf16_greedy(ckpts["target"], ids, 40), p


def test_every_drafter_lossless_against_bf16_plain(any_bf16):
    pipe, accepted = any_bf16, 0
    plain = [pipe.generate(p, max_new_tokens=40, draft="none").token_ids for p in PROMPTS]
    for p, want in zip(PROMPTS, plain):
        for draft, k in [("model", 2), ("model", 4), ("ngram", 4), ("recycle", 4), ("recycle", "auto")]:
            g = pipe.generate(p, max_new_tokens=40, draft=draft, k=k)
            assert g.token_ids == want, (p, draft, k)
            accepted += g.stats.accepted
    assert accepted > 0
    opts = dict(max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=40, seed=3)
    none = pipe.generate(PROMPTS[0], draft="none", **opts).token_ids
    for draft in ("model", "ngram", "recycle"):
        assert pipe.generate(PROMPTS[0], draft=draft, k=4, **opts).token_ids == none, draft
    for draft in (None, "none", "ngram", "recycle"):  # the engine: pool rows, B-row and mixed calls
        got = pipe.generate_batch(PROMPTS, max_new_tokens=40, draft=draft)
        assert [g.token_ids for g in got] == plain, draft


def test_bf16dot_is_another_target(bundle_noisy, pipe):
    """bf16dot rounds the activations too: its own numerics and logits, measured at load like bf16's."""
    lib = kernels.library(16)
    if not kernels.matmul_dot(lib):
        with pytest.raises(OptionError, match="avx512_bf16"):
            specexport.load(bundle_noisy, backend="onnxruntime-bf16dot")
        return
    dot = specexport.load(bundle_noisy, backend="onnxruntime-bf16dot")
    assert dot.target.weights == "bf16dot" and "bfloat16 activations" in dot.target.numerics
    assert dot.target.entry.speculative and dot.target.entry.verify_drift <= dot.target.entry.parity_tolerance
    a = [dot.generate(p, max_new_tokens=40, draft="none").token_ids for p in PROMPTS]
    b = [pipe.generate(p, max_new_tokens=40, draft="none").token_ids for p in PROMPTS]
    assert a != b  # another model: the rounded activations change some greedy token on these prompts


def test_bf16_refused_where_the_kernel_cannot_hold_it(bundle_noisy, bundle_portable, monkeypatch):
    with pytest.raises(OptionError, match="not fused"):
        specexport.load(bundle_portable, backend="onnxruntime-bf16")
    monkeypatch.setenv("SPECEXPORT_MATMUL", "0")
    with pytest.raises(OptionError, match="SPECEXPORT_MATMUL=0"):
        specexport.load(bundle_noisy, backend="onnxruntime-bf16")


@pytest.fixture(scope="module")
def amx_dot(bundle_noisy):
    """bf16dot with its attention on AMX tiles (the default where its MatMuls run on them; set here all the same)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECEXPORT_ATTENTION_AMX", "1")
    lib = kernels.library(16)
    if not (kernels.matmul_dot(lib) and kernels.attention_amx(lib)):
        mp.undo()
        pytest.skip("no AMX here (amx_bf16, and Linux's grant of the tiles): bf16dot's attention runs in float32")
    yield specexport.load(bundle_noisy, backend="onnxruntime-bf16dot")
    mp.undo()


def test_amx_attention_rows_score_alike_in_any_call(amx_dot, bundle_noisy, monkeypatch):
    """bf16dot's attention on AMX tiles (kernels/gqa_amx.h): numerics of its own (close to the float32
    attention's, not equal), and past 64 cached tokens, where the tiles sum the cache's keys, a chain's and a
    tree's verify rows still equal their decode calls bit for bit."""
    from specexport import bundle
    from specexport.backends.ort import OrtBackend
    from specexport.runtime.prefill import feed, verify_drifts

    t = amx_dot.target
    assert "attention's products (AMX tiles)" in t.numerics and t.entry.exact_trees
    for seed, n_past in ((0, 70), (1, 87), (2, 33), (3, 60), (4, 61)):
        assert verify_drifts(t, seed, n_past=n_past) == (0.0, 0.0), (seed, n_past)
    monkeypatch.setenv("SPECEXPORT_ATTENTION_AMX", "0")
    m = bundle.read(bundle_noisy)
    f32 = OrtBackend(bundle_noisy, m.target, m.buckets, weights="bf16dot")
    assert "attention" not in f32.numerics
    ids = np.random.default_rng(0).integers(3, m.target.arch["vocab_size"], 90).tolist()
    a, _ = feed(t, t.new_cache(), ids)
    b, _ = feed(f32, f32.new_cache(), ids)
    assert not np.array_equal(a, b) and np.abs(a - b).max() < 0.02 * np.abs(b).max()


def test_amx_attention_lossless_past_the_tiles(amx_dot):
    """Every drafter, solo and batched, against its own plain decoding, on generations that run past 64
    tokens (the tiles' part of each query's keys grows from there)."""
    plain = [amx_dot.generate(p, max_new_tokens=64, draft="none").token_ids for p in PROMPTS]
    accepted = 0
    for p, want in zip(PROMPTS, plain):
        for draft, k in [("model", 4), ("ngram", 4), ("recycle", "auto")]:
            g = amx_dot.generate(p, max_new_tokens=64, draft=draft, k=k)
            assert g.token_ids == want, (p, draft, k)
            accepted += g.stats.accepted
    assert accepted > 0
    for draft in ("none", "model", "recycle"):
        got = amx_dot.generate_batch(PROMPTS, max_new_tokens=64, draft=draft)
        assert [g.token_ids for g in got] == plain, draft


def random_tree_mismatches(m, trials: int, seed: int) -> list:
    """Random draft trees (any branching, up to the largest verify profile) at random cache lengths on model m:
    the nodes of each tree's deepest path whose verify-call logits differ from their decode call's, once the path
    before them is committed (a node sits at another slot of the verify call than of its decode call)."""
    from specexport.runtime.prefill import feed

    rng, bad = np.random.default_rng(seed), []
    V, T = m.entry.arch["vocab_size"], max(m.entry.profiles[f"verify_{k}"] for k in m.entry.verify_ks())
    for trial in range(trials):
        n_past = int(rng.integers(2, m.capacity - 2 * T))
        parent = [-1] + [int(rng.integers(0, i)) for i in range(1, T)]
        depth, mask = [0] * T, np.eye(T, dtype=bool)
        for i in range(1, T):
            depth[i] = depth[parent[i]] + 1
            j = parent[i]
            while j >= 0:
                mask[i, j], j = True, parent[j]
        ids = rng.integers(3, V, n_past + T).tolist()
        cache = m.new_cache()
        feed(m, cache, ids[:n_past])
        tree = m.step(cache, ids[n_past:], n_past, new_mask=mask[None], positions=n_past + np.array(depth)).logits
        path, i = [], int(np.argmax(depth))
        while i >= 0:
            path, i = [i] + path, parent[i]
        for d, i in enumerate(path):
            out = m.step(cache, [ids[n_past + i]], n_past + d)
            cache.commit(out.new_kv, [0])
            if not np.array_equal(tree[i], out.logits[0]):
                bad.append((trial, n_past, parent, i))
    return bad


def test_amx_attention_random_trees_score_as_their_paths(amx_dot):
    """Every node on random trees' paths scores bit for bit as its decode call (the real model's version of this
    check, tests/test_smollm2.py, is the one that caught a weights' sum split by slot)."""
    assert random_tree_mismatches(amx_dot.target, 40, 7) == []
