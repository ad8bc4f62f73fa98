"""specexport's MatMulNBits (specexport/kernels/matmul4.c), int4 (and int8) weights and int8 activations, on real
onnxruntime sessions: one-node graphs against the documented arithmetic, its rows' independence from their call, and an
int4-a8 bundle built from a tiny checkpoint whose speculation stays token-identical to its plain decoding."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import specexport
from conftest import build_bundle
from specexport import kernels
from specexport.backends.ort import session_options


@pytest.fixture(autouse=True)
def vnni():
    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernels cannot be built")
    lib = kernels.library(64)
    if lib is None or not kernels.matmul4_on(lib):
        pytest.skip("this CPU has neither AVX512-VNNI nor AVX2: the int4 kernel is not built, onnxruntime's "
                    "MatMulNBits runs")


def quantised(K: int, N: int, seed: int, bits: int = 4):
    """Random 4-bit weights as MatMulNBits takes them (B [N, K/32, 16]: k = 2i in byte i's low nibble, 2i + 1 in
    its high; scales [N, K/32]) and the nibbles q [N, K] themselves; 8-bit: B [N, K/32, 32], byte k holds q."""
    nb = -(-K // 32)
    rng = np.random.default_rng(seed)
    q = np.zeros((N, nb * 32), np.uint8)
    q[:, :K] = rng.integers(0, 1 << bits, (N, K))
    B = (q[:, 0::2] | q[:, 1::2] << 4).reshape(N, nb, 16).astype(np.uint8) if bits == 4 else q.reshape(N, nb, 32)
    S = (rng.random((N, nb)) * 0.02 + 1e-3).astype(np.float32)
    return B, S, q


def session(tmp_path, K, N, B, S, nbits=True, level=4, bits=4, lib=None):
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=K, N=N, bits=bits,
                            block_size=32, accuracy_level=level)
    g = helper.make_graph([node], "mm4", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                          [numpy_helper.from_array(B, "B"), numpy_helper.from_array(S, "S")])
    path = tmp_path / f"mm4-{K}-{N}-{nbits}-{level}-{bits}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]),
              path)
    return ort.InferenceSession(str(path), session_options(None, lib or kernels.library(64), "float32", nbits),
                                providers=["CPUExecutionProvider"])


def reference(x: np.ndarray, q: np.ndarray, S: np.ndarray, bits: int = 4) -> np.ndarray:
    """The kernel's arithmetic in float64: each row's activations per block of 32 as int8 (max|a| / 127, to
    nearest even), exact int32 block sums of (q - 8) x qa (8-bit weights: q - 128), scaled by both scales and
    summed over the blocks."""
    M, K = x.shape
    nb = S.shape[1]
    a = np.zeros((M, nb * 32), np.float32)
    a[:, :K] = x
    a = a.reshape(M, nb, 32)
    amax = np.abs(a).max(-1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qa = np.clip(np.rint(a * inv[..., None]), -127, 127)
    w = q.astype(np.float64).reshape(-1, nb, 32) - (1 << bits - 1)
    dots = np.einsum("mbk,nbk->mnb", qa, w)
    return (dots * (amax / np.float32(127))[:, None, :] * S[None].astype(np.float64)).sum(-1)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("K,N", [(64, 1), (64, 17), (96, 64), (80, 100), (576, 130), (1536, 70)])
def test_matmul4_is_the_documented_arithmetic(tmp_path, K, N, bits):
    """Every panel shape (a partial last group and panel, a partial last block of k), 1 to 9 rows, 4- and 8-bit
    weights: within float rounding of the documented int8 x int4 (int8) arithmetic, and within the int8
    activations' error of the float32 product with the dequantised weights."""
    B, S, q = quantised(K, N, K + N, bits)
    s = session(tmp_path, K, N, B, S, bits=bits)
    W = (q[:, :K].astype(np.float32) - (1 << bits - 1)) * np.repeat(S, 32, axis=1)[:, :K]
    rng = np.random.default_rng(N)
    for M in (1, 2, 3, 4, 7, 9):
        x = rng.standard_normal((M, K), dtype=np.float32)
        x[0, :5] = 0  # a block may start with zeros; a whole zero row is checked below
        y = s.run(None, {"A": x})[0]
        ref = reference(x, q, S, bits)
        assert y.shape == (M, N) and np.abs(y - ref).max() <= 1e-5 * (1 + np.abs(ref).max()), (M, K, N)
        assert np.abs(y - x @ W.T).max() <= 0.02 * np.abs(x @ W.T).max() + 1e-4
    assert not s.run(None, {"A": np.zeros((2, K), np.float32)})[0].any()


@pytest.mark.parametrize("K", [100, 1540])
def test_matmul4_large_calls(tmp_path, K):
    """Calls large enough that the threads split the rows' quantisation (M x K >= 16,384), with a partial last
    block of k (4 of 32): the documented arithmetic, each row bit-identical to its one-row call; a NaN in a row
    gives that row NaN outputs and leaves the others alone."""
    N = 70
    B, S, q = quantised(K, N, K)
    s = session(tmp_path, K, N, B, S)
    x = np.random.default_rng(K).standard_normal((300, K), dtype=np.float32)
    y = s.run(None, {"A": x})[0]
    ref = reference(x, q, S)
    assert np.abs(y - ref).max() <= 1e-5 * (1 + np.abs(ref).max())
    for i in (0, 1, 150, 299):
        assert (s.run(None, {"A": x[i:i + 1]})[0] == y[i]).all()
    x[7, K - 1] = np.nan
    z = s.run(None, {"A": x})[0]
    assert np.isnan(z[7]).all() and (np.delete(z, 7, 0) == np.delete(y, 7, 0)).all()


def test_matmul4_rows_do_not_depend_on_their_call(tmp_path):
    """A row's output is bit-identical alone, in any position of a call, beside any other rows: what lets
    an int4-a8 target verify trees exactly."""
    K, N = 576, 300
    B, S, _ = quantised(K, N, 1)
    s = session(tmp_path, K, N, B, S)
    x = np.random.default_rng(2).standard_normal((11, K), dtype=np.float32)
    alone = np.concatenate([s.run(None, {"A": x[i:i + 1]})[0] for i in range(11)])
    for rows in (x, x[::-1], np.concatenate([x[3:5], x])):
        y = s.run(None, {"A": rows})[0]
        for i, r in enumerate(rows):
            j = next(j for j in range(11) if (x[j] == r).all())
            assert (y[i] == alone[j]).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul4_avx2_and_avx512_give_the_same_bits(tmp_path, monkeypatch, bits):
    """The AVX2 path (VPMADDUBSW on nibbles; 8-bit weights as two nibble halves whose int32 dots are added before
    the block is scaled) and the AVX512-VNNI path (VPDPBUSD on nibbles, 8-bit weights on their bytes) reach the
    same int32 block dots and add them alike: a model quantised so scores the same on either CPU."""
    if "avx512_vnni" not in kernels.cpu_flags().split():
        pytest.skip("this CPU has no AVX512-VNNI: only the AVX2 path runs here")
    monkeypatch.delenv("SPECEXPORT_MARCH", raising=False)  # scripts/test.sh runs this file again on the AVX2 build
    native = kernels.library(64)
    monkeypatch.setenv("SPECEXPORT_MARCH", "haswell")
    avx2 = kernels.library(64)
    assert native != avx2 and kernels.matmul4_on(avx2)
    K, N = 608, 200  # a partial last panel; K of 19 blocks
    B, S, _ = quantised(K, N, 7, bits)
    x = np.random.default_rng(8).standard_normal((9, K), dtype=np.float32)
    for M in (1, 2, 3, 4, 9):
        ys = [session(tmp_path, K, N, B, S, bits=bits, lib=lib).run(None, {"A": x[:M]})[0] for lib in (native, avx2)]
        assert (ys[0] == ys[1]).all(), (bits, M)


def test_matmul4_only_where_asked_and_its_off_switch(tmp_path, monkeypatch):
    """Sessions without specexport.matmul_nbits run onnxruntime's MatMulNBits (a float32-activation target's
    stays float32); SPECEXPORT_MATMUL4=0 turns it off everywhere."""
    K, N = 96, 40
    B, S, q = quantised(K, N, 3)
    W = (q[:, :K].astype(np.float32) - 8) * np.repeat(S, 32, axis=1)[:, :K]
    x = np.random.default_rng(4).standard_normal((3, K), dtype=np.float32)
    exact = x.astype(np.float64) @ W.T.astype(np.float64)
    own = session(tmp_path, K, N, B, S, nbits=False, level=1).run(None, {"A": x})[0]  # float32 activations
    assert np.abs(own - exact).max() <= 1e-5 * np.abs(exact).max()
    ours = session(tmp_path, K, N, B, S, nbits=True, level=1).run(None, {"A": x})[0]  # asked for: int8 activations
    assert np.abs(ours - exact).max() > 1e-4 * np.abs(exact).max()
    assert kernels.matmul4_on(kernels.library(64))
    monkeypatch.setenv("SPECEXPORT_MATMUL4", "0")
    assert not kernels.matmul4_on(kernels.library(64))


def test_int4_a8_bundle_on_the_kernel_speculates_token_identically(ckpts, tmp_path):
    """An int4 target with int8 activations built with --pad-decode loads on the kernel without the pad (its rows
    score alike in any call, measured again at load: drift 0.0), and prompt lookup, token recycling (trees) and
    the batching engine all give its plain decoding's tokens."""
    out = build_bundle(tmp_path / "a8", ckpts["target"], ks=(2, 4), target_quant="int4", target_activations="int8",
                       pad_decode=True)
    pipe = specexport.load(out)
    t = pipe.target
    assert t.nbits and not t.pad_decode and t.entry.verify_drift == 0.0 and t.exact_trees
    accepted = 0
    prompts = ("hello world", "one two three one two three one two", "a b c d e f g")
    plain = {p: pipe.generate(p, max_new_tokens=30, draft="none").token_ids for p in prompts}
    for p in prompts:
        for draft in ("ngram", "recycle"):
            g = pipe.generate(p, max_new_tokens=30, draft=draft, k=4)
            assert g.token_ids == plain[p], (p, draft)
            accepted += g.stats.accepted
    assert accepted > 0
    pipe.start_engine(max_batch=2, warm=False)
    try:
        got = pipe.generate_batch(list(prompts), max_new_tokens=30, draft="recycle")
        assert [g.token_ids for g in got] == [plain[p] for p in prompts]
    finally:
        pipe.close()


def test_int8_self_draft_on_the_kernel(ckpts, tmp_path):
    """An int8 self-draft (--draft self:int8) runs its MatMulNBits on the kernel, reads the target's cache, and is
    the default draft as the int4 one is; solo and on the batching engine (greedy and Gumbel) every request gets
    its plain decoding's tokens, and its proposals are accepted."""
    pipe = specexport.load(build_bundle(tmp_path / "i8", ckpts["target"], "self:int8", ks=(2, 4), batch_sizes=(1, 2)))
    assert pipe.draft.entry.kind == "int8" and pipe.draft.nbits and pipe._self_draft_pays()
    prompts = ("hello world", "one two three one two three one two", "a b c d e f g")
    for kw in ({}, dict(temperature=0.8, seed=5)):
        plain = [pipe.generate(p, max_new_tokens=24, draft="none", **kw).token_ids for p in prompts]
        solo = [pipe.generate(p, max_new_tokens=24, draft="model", k=4, **kw) for p in prompts]
        assert [g.token_ids for g in solo] == plain
        assert sum(g.stats.accepted for g in solo) > 0
        pipe.start_engine(max_batch=2, warm=False)
        try:
            got = pipe.generate_batch(list(prompts), max_new_tokens=24, **kw)  # the default draft: the model
            assert [g.token_ids for g in got] == plain
        finally:
            pipe.close()
