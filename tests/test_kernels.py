"""specexport's GroupQueryAttention kernel (specexport/kernels/gqa.c) against onnxruntime's own, on a real fused
bundle's target graph: the same calls on the same graph loaded twice, once with the kernel library
registered, once without. The rest of the suite (lossless greedy and sampling, the engine) runs on the kernel."""
import json
import logging
import shutil
import subprocess

import numpy as np
import onnxruntime as ort
import pytest

from specexport import kernels
from specexport.backends.ort import fused_feeds, session_options


@pytest.fixture(scope="module")
def graph(bundle_noisy):
    arch = json.loads((bundle_noisy / "manifest.json").read_text())["models"]["target"]["arch"]
    path = str(bundle_noisy / "target.onnx")
    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernel cannot be built, onnxruntime's runs")
    lib = kernels.library(arch["head_dim"])
    assert lib, "the kernel library did not build with the C compiler found"
    ours = ort.InferenceSession(path, session_options(None, lib), providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(path, session_options(None, None), providers=["CPUExecutionProvider"])
    S = 96  # the fixture's capacity
    shape = (arch["num_layers"], 2, 4, arch["num_kv_heads"], S, arch["head_dim"])
    return {"ours": ours, "theirs": theirs, "shape": shape, "V": arch["vocab_size"]}


def run(sess, cache, n, ids, mask=None, prompt=None):
    """One call on rows at cache lengths n [B] with new tokens ids [B,T] (mask [B,T,T]: a tree; prompt: the
    rows' lengths in onnxruntime's "first prompt" mode: no past, total_len = T, shorter rows right-padded),
    past and present bound to `cache` [L,2,B,Hkv,S,D] (written in place) -> logits [B,T,V]."""
    B, T = ids.shape
    pos = n[:, None] + np.arange(T)[None]
    f = fused_feeds(n, ids, pos, mask)
    if prompt is not None:  # the engine's batched first chunks
        f["total_len"] = np.array(T, np.int32)
        f["seqlens_k"] = np.array(prompt, np.int32) - 1
        f["attn_bias"] = np.zeros((B, 1, T, T), np.float32)
    f["logit_rows"] = np.arange(T, dtype=np.int64)
    io = sess.io_binding()
    for i in range(cache.shape[0]):
        for j, kind in enumerate(("key", "value")):
            ov = ort.OrtValue.ortvalue_from_numpy(cache[i, j])
            io.bind_ortvalue_input(f"past_{kind}.{i}", ov)
            io.bind_ortvalue_output(f"present_{kind}.{i}", ov)
    for k, v in f.items():
        io.bind_cpu_input(k, v)
    io.bind_output("logits")
    io.bind_output("top_ids")
    sess.run_with_iobinding(io)
    return io.copy_outputs_to_cpu()[0]


def both(graph, n, T, mask=None, prompt=None, seed=0):
    rng = np.random.default_rng(seed)
    B = len(n)
    base = rng.standard_normal(graph["shape"], dtype=np.float32)[:, :, :B].copy()
    ids = rng.integers(3, graph["V"], (B, T))
    out = {}
    for who in ("ours", "theirs"):
        cache = base.copy()
        out[who] = run(graph[who], cache, np.array(n), ids, mask, prompt), cache
    return out, base


@pytest.mark.parametrize("n,T", [([40], 1), ([5, 40, 77, 0], 1), ([30], 5), ([0], 8), ([61], 8)])
def test_kernel_matches_onnxruntime(graph, n, T):
    """Decode rows at different lengths, a verify chain, prefill chunks at 0 and with a past: the same logits
    as onnxruntime's kernel within float32 rounding, the same K/V written into slots n..n+T-1, nothing else
    in the cache touched."""
    out, base = both(graph, n, T)
    (lo, co), (lt, ct) = out["ours"], out["theirs"]
    assert np.abs(lo - lt).max() < 1e-4 * max(1.0, np.abs(lt).max())
    assert (lo.argmax(-1) == lt.argmax(-1)).all()
    for b, nb in enumerate(n):
        written = slice(nb, nb + T)
        np.testing.assert_allclose(co[:, :, b, :, written], ct[:, :, b, :, written], atol=1e-5)
        assert not np.array_equal(co[:, :, b, :, written], base[:, :, b, :, written])
        for rest in (slice(0, nb), slice(nb + T, None)):
            assert np.array_equal(co[:, :, b, :, rest], base[:, :, b, :, rest])


def test_kernel_tree_mask(graph):
    """A tree's verify rows: each token sees only its ancestors among the new tokens (attn_bias)."""
    T = 6
    parent = [-1, 0, 0, 1, 1, 2]
    mask = np.zeros((1, T, T), bool)
    for t in range(T):
        a = t
        while a >= 0:
            mask[0, t, a] = True
            a = parent[a]
    out, _ = both(graph, [25], T, mask)
    assert np.abs(out["ours"][0] - out["theirs"][0]).max() < 1e-4 * max(1.0, np.abs(out["theirs"][0]).max())


def test_kernel_first_prompt_padded_rows(graph):
    """total_len == T: rows without a past, shorter ones right-padded (seqlens_k): the valid rows' logits."""
    T, lens = 8, [8, 3, 5]
    out, _ = both(graph, [0, 0, 0], T, prompt=lens)
    for b, m in enumerate(lens):
        assert np.abs(out["ours"][0][b, :m] - out["theirs"][0][b, :m]).max() < 1e-4 * max(1.0, np.abs(out["theirs"][0]).max())


def test_kernel_several_tokens_per_row_in_a_batch(graph):
    """What onnxruntime's kernel does not take: B > 1 rows with a past and T > 1 new tokens each. Each row
    equals onnxruntime's own call of that row alone."""
    n, T = [5, 20, 33], 4
    rng = np.random.default_rng(3)
    base = rng.standard_normal(graph["shape"], dtype=np.float32)[:, :, :3].copy()
    ids = rng.integers(3, graph["V"], (3, T))
    cache = base.copy()
    ours = run(graph["ours"], cache, np.array(n), ids)
    for b in range(3):
        alone = base[:, :, b:b + 1].copy()
        ref = run(graph["theirs"], alone, np.array(n[b:b + 1]), ids[b:b + 1])
        assert np.abs(ours[b] - ref[0]).max() < 1e-4 * max(1.0, np.abs(ref).max())
        np.testing.assert_allclose(cache[:, :, b:b + 1], alone, atol=1e-5)


def test_kernel_refuses_a_bad_call_and_goes_on(graph):
    """A row whose length does not fit the cache is an error with the reason, not a crash; the session runs
    the next call as before."""
    rng = np.random.default_rng(0)
    cache = rng.standard_normal(graph["shape"], dtype=np.float32)[:, :, :1].copy()
    with pytest.raises(Exception, match="seqlens_k out of range"):
        run(graph["ours"], cache, np.array([95]), np.array([[5, 6]]))
    out, _ = both(graph, [10], 1)
    assert (out["ours"][0].argmax(-1) == out["theirs"][0].argmax(-1)).all()


def test_library_switch_and_a_failed_build(monkeypatch, tmp_path, caplog):
    """SPECEXPORT_KERNELS=0, a head size it does not serve, or a compiler that fails: None (onnxruntime's own
    kernel runs), with a warning for the failed build."""
    monkeypatch.setenv("SPECEXPORT_KERNELS", "0")
    assert kernels.library(64) is None
    monkeypatch.setenv("SPECEXPORT_KERNELS", "1")
    assert kernels.library(72) is None
    monkeypatch.setenv("SPECEXPORT_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")
    with caplog.at_level(logging.WARNING, logger="specexport"):
        assert kernels.library(64) is None
    assert "could not be built" in caplog.text
    assert not list(tmp_path.rglob("*.so")) and not list(tmp_path.rglob("*.tmp"))


def test_build_for_another_cpu(monkeypatch):
    """SPECEXPORT_MARCH=haswell builds the AVX2 code on this CPU (scripts/test.sh runs the kernel tests on it
    where the CPU has AVX-512; it finds this build in the cache): a library of its own, without what only
    AVX-512 builds have (bf16dot; the int4 kernel has its AVX2 path)."""
    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernel cannot be built")
    if "avx2" not in kernels.cpu_flags().split():
        pytest.skip("this CPU has no AVX2: a Haswell build would not run here")
    monkeypatch.delenv("SPECEXPORT_MARCH", raising=False)
    native = kernels.library(64)
    monkeypatch.setenv("SPECEXPORT_MARCH", "haswell")
    avx2 = kernels.library(64)
    assert native and avx2 and native != avx2
    assert not kernels.matmul_dot(avx2) and kernels.matmul4_on(avx2)  # the int4 kernel has an AVX2 path
    if shutil.which("objdump"):  # not one AVX-512 register in its code
        assert b"zmm" not in subprocess.run(["objdump", "-d", avx2], capture_output=True, check=True).stdout


def test_kernel_scores_a_token_alike_in_any_call(bundle_noisy):
    """A verify call's rows (a chain, and a tree whose second branch sits after the first in the call) equal
    decode calls of the same tokens exactly with specexport's kernel (its two score paths sum alike, the
    softmax's weights are summed in key order); onnxruntime's own differs in float32 rounding."""
    from specexport import bundle
    from specexport.backends.ort import OrtBackend
    from specexport.runtime.prefill import verify_drifts

    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernel cannot be built")
    m = bundle.read(bundle_noisy)
    model = OrtBackend(bundle_noisy, m.target, m.buckets)
    assert model.kernel
    assert [verify_drifts(model, seed) for seed in (0, 1)] == [(0.0, 0.0)] * 2


def test_unpadded_prefill_is_the_padded_one(bundle_noisy, monkeypatch):
    """On specexport's kernels a single-row call takes any T (`any_t`), so a prompt's last chunk runs unpadded:
    the prompt's last logits and its cache are bit-identical to those of the profiles' padded plan."""
    from specexport import bundle
    from specexport.backends.ort import OrtBackend
    from specexport.runtime import prefill

    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernel cannot be built")
    monkeypatch.setenv("SPECEXPORT_MATMUL", "1")  # the MatMul kernel whatever this CPU's vector width
    m = bundle.read(bundle_noisy)
    model = OrtBackend(bundle_noisy, m.target, m.buckets)
    assert model.any_t
    ids = np.random.default_rng(0).integers(3, m.target.arch["vocab_size"], 36).tolist()  # 4 chunks of 8 + 4
    got = {}
    for any_t in (True, False):
        model.any_t, calls, step = any_t, [], model.step
        model.step = lambda cache, x, *a, **k: calls.append(len(x)) or step(cache, x, *a, **k)
        cache = model.new_cache()
        logits, _ = prefill.feed(model, cache, ids)
        del model.step
        got[any_t] = logits, cache.data[..., :len(ids), :].copy(), calls
    (a, ca, ta), (b, cb, tb) = got[True], got[False]
    assert sum(ta) == len(ids) and not set(ta) <= model.profile_ts  # unpadded: a T that is no profile
    assert sum(tb) > len(ids) and set(tb) <= model.profile_ts  # padded to the profiles
    assert np.array_equal(a, b) and np.array_equal(ca, cb)
    model.any_t = False
    with pytest.raises(Exception, match="no profile with T="):
        model.step(model.new_cache(), ids[:7], 0)
