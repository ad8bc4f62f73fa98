"""specexport's MatMul kernel (specexport/kernels/matmul.c) on real onnxruntime sessions: one-node graphs whose B is
a weight (an initializer), run with the kernel library registered. Its contract: every output element is one
chain of fused multiply-adds over k in order from 0, so a row's result does not depend on what shares its call.
The fused bundles' calls (every other test, and test_kernels.py against onnxruntime's own) run on it too."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specexport import kernels
from specexport.backends.ort import session_options


@pytest.fixture(autouse=True)
def matmul_on(monkeypatch):
    # on by default only where the build has AVX-512; here on whatever this CPU is, so both builds are tested
    monkeypatch.setenv("SPECEXPORT_MATMUL", "1")
    if kernels.compiler() is None:
        pytest.skip("no C compiler here (.ci/run installs gcc): specexport's kernels cannot be built")


def session(tmp_path, W: np.ndarray | None, a_shape, b_shape=None, lib=True, weights="float32"):
    """Y = MatMul(A, W) with W an initializer (W None: B is a second graph input of b_shape); `weights`: the
    kernel's weight format (session_options)."""
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_shape)]
    inits = []
    if W is None:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, b_shape))
    else:
        inits.append(numpy_helper.from_array(W, "B"))
    g = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "mm", inputs,
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / f"mm{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]), path)
    return ort.InferenceSession(str(path), session_options(None, kernels.library(64) if lib else None, weights),
                                providers=["CPUExecutionProvider"])


def fma_chain(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """x [M, K] @ W [K, N] as the kernel computes it: acc = fma(x[:, k], W[k], acc) for k = 0 .. K-1 in float32.
    A float32 product is exact in float64 and the sum is rounded to float32 once (a double rounding could differ
    from a true fma only when the two addends' exponents are ~29 bits apart: not with these numbers)."""
    acc = np.zeros((x.shape[0], W.shape[1]), np.float32)
    for k in range(x.shape[1]):
        acc = (x[:, k, None].astype(np.float64) * W[k].astype(np.float64) + acc).astype(np.float32)
    return acc


@pytest.mark.parametrize("K,N", [(40, 1), (40, 17), (64, 100), (96, 130), (33, 197), (150, 64), (600, 70), (1400, 50)])
def test_matmul_is_the_fma_chain_bit_for_bit(tmp_path, K, N):
    """Every shape of panel (whole, split between threads, a partial last vector), rows from 1 to past a few
    register blocks (one pass up to 9 rows with AVX-512, passes of equal size past it), K past a KC chunk (1,365
    rows with AVX-512: its sums carried through Y): the outputs are exactly the documented chain. (onnxruntime's MLAS gives the
    same chain while K fits its K block, 256; past it, test_matmul_off_switch tells the two apart.)"""
    rng = np.random.default_rng(K * 1000 + N)
    W = rng.standard_normal((K, N), dtype=np.float32)
    s = session(tmp_path, W, [1, "M", K])
    for M in (1, 5, 6, 7, 9, 10, 13, 19, 40) + ((300,) if K > N else ()):  # 256+ rows with K > N: split by rows
        x = rng.standard_normal((1, M, K), dtype=np.float32)
        y = s.run(None, {"A": x})[0]
        assert y.shape == (1, M, N)
        np.testing.assert_array_equal(y[0], fma_chain(x[0], W))


def test_matmul_rows_do_not_depend_on_their_call(tmp_path):
    """A row alone, and the same row among 12 others (a verify block, a batch), give the same bits; a 2-D A
    and a 4-D A are the same rows too."""
    rng = np.random.default_rng(1)
    K, N = 200, 300
    W = rng.standard_normal((K, N), dtype=np.float32)
    x = rng.standard_normal((13, K), dtype=np.float32)
    many = session(tmp_path, W, ["M", K]).run(None, {"A": x})[0]
    one = session(tmp_path, W, [1, 1, 1, K])
    for r in (0, 6, 12):
        np.testing.assert_array_equal(one.run(None, {"A": x[r][None, None, None]})[0][0, 0, 0], many[r])
    assert np.abs(many - x.astype(np.float64) @ W.astype(np.float64)).max() < 1e-3


def test_matmul_other_shapes_run_onnxruntimes_own(tmp_path):
    """B not a weight (a graph input), batched (3-D), or a vector: onnxruntime's MatMul runs inside ours
    (InvokeOp), with numpy's broadcasting; A 1-D against a matrix weight takes the kernel."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 5, 24), dtype=np.float32), rng.standard_normal((2, 24, 7), dtype=np.float32)
    s = session(tmp_path, None, [2, 5, 24], [2, 24, 7])
    np.testing.assert_allclose(s.run(None, {"A": a, "B": b})[0], a @ b, rtol=1e-5, atol=1e-5)
    s = session(tmp_path, None, [5, 24], [24, 7])
    np.testing.assert_allclose(s.run(None, {"A": a[0], "B": b[0]})[0], a[0] @ b[0], rtol=1e-5, atol=1e-5)
    s = session(tmp_path, None, [3, 1, 5, 24], [2, 24, 7])  # broadcast batch dims
    a4 = rng.standard_normal((3, 1, 5, 24), dtype=np.float32)
    np.testing.assert_allclose(s.run(None, {"A": a4, "B": b})[0], a4 @ b, rtol=1e-5, atol=1e-5)
    v = rng.standard_normal(24, dtype=np.float32)
    s = session(tmp_path, None, [5, 24], [24])
    np.testing.assert_allclose(s.run(None, {"A": a[0], "B": v})[0], a[0] @ v, rtol=1e-5, atol=1e-5)
    W = rng.standard_normal((24, 7), dtype=np.float32)
    s = session(tmp_path, W, [24])
    np.testing.assert_array_equal(s.run(None, {"A": v})[0], fma_chain(v[None], W)[0])


def test_matmul_refuses_a_mismatch_and_goes_on(tmp_path):
    """A call whose A does not fit the weight fails with a message naming it; the session then runs on."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((16, 20), dtype=np.float32)
    s = session(tmp_path, W, [1, "M", "K"])
    with pytest.raises(Exception, match="last dimension"):
        s.run(None, {"A": np.ones((1, 2, 15), np.float32)})
    x = rng.standard_normal((1, 3, 16), dtype=np.float32)
    np.testing.assert_array_equal(s.run(None, {"A": x})[0][0], fma_chain(x[0], W))


def test_matmul_off_switch(tmp_path, monkeypatch):
    """SPECEXPORT_MATMUL=0 leaves MatMul to onnxruntime (registered per session: the next session sees it)."""
    rng = np.random.default_rng(4)
    K, N = 512, 64
    W = rng.standard_normal((K, N), dtype=np.float32)
    x = rng.standard_normal((1, 4, K), dtype=np.float32)
    ours = session(tmp_path, W, [1, 4, K]).run(None, {"A": x})[0]
    monkeypatch.setenv("SPECEXPORT_MATMUL", "0")
    off = session(tmp_path, W, [1, 4, K]).run(None, {"A": x})[0]
    theirs = session(tmp_path, W, [1, 4, K], lib=False).run(None, {"A": x})[0]
    np.testing.assert_array_equal(ours[0], fma_chain(x[0], W))
    np.testing.assert_array_equal(off, theirs)  # the same onnxruntime kernel
    assert not np.array_equal(off, ours)  # MLAS sums K in blocks of 256, then adds the blocks' sums


def swiglu_session(tmp_path, W, lib=True, weights="float32", profile=False):
    """Y = MatMulSwiGLU(A, W) as the fused bundles' graphs hold it: the node and its function definition."""
    from specexport.exporter.onnx import swiglu_function

    g = helper.make_graph([helper.make_node("MatMulSwiGLU", ["A", "W"], ["Y"], domain="specexport")], "glu",
                          [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", W.shape[0]])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [numpy_helper.from_array(W, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("specexport", 1)],
                          functions=[swiglu_function()])
    path = tmp_path / f"glu{len(list(tmp_path.iterdir()))}.onnx"
    onnx.save(m, path)
    so = session_options(None, kernels.library(64) if lib else None, weights)
    so.enable_profiling = profile
    so.profile_file_prefix = str(tmp_path / "prof")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("K,F", [(96, 40), (300, 70), (64, 768)])
def test_swiglu_is_silu_gate_times_up(tmp_path, K, F):
    """MatMulSwiGLU on the kernel: silu(x W[:, :F]) * x W[:, F:] with each product the MatMul's chain (F not a
    whole vector; rows from one (a decode row) to past 256 (split by rows, the epilogue in each thread)), the
    same as its function definition where the library is not loaded; a row's bits do not depend on its call."""
    import json

    rng = np.random.default_rng(K + F)
    W = rng.standard_normal((K, 2 * F), dtype=np.float32) * 0.2
    s, plain = swiglu_session(tmp_path, W, profile=True), swiglu_session(tmp_path, W, lib=False)
    x = rng.standard_normal((1, 300, K), dtype=np.float32)
    for M in (1, 7, 70, 300):
        y = s.run(None, {"A": x[:, :M]})[0]
        assert y.shape == (1, M, F)
        g, u = fma_chain(x[0, :M], W[:, :F]).astype(np.float64), fma_chain(x[0, :M], W[:, F:]).astype(np.float64)
        np.testing.assert_allclose(y[0], g / (1 + np.exp(-g)) * u, rtol=2e-6, atol=1e-6)
        np.testing.assert_allclose(plain.run(None, {"A": x[:, :M]})[0], y, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(y[0, M - 1], s.run(None, {"A": x[:, M - 1:M]})[0][0, 0])
    ran = {e["args"]["op_name"] for e in json.load(open(s.end_profiling())) if e.get("cat") == "Node" and "args" in e}
    assert "MatMulSwiGLU" in ran and "Sigmoid" not in ran  # the kernel ran, not the function's ops


def test_swiglu_refuses_what_it_cannot_take(tmp_path):
    """An odd number of columns cannot be gate and up side by side: refused when the session is made, with why."""
    W = np.ones((8, 7), np.float32)
    with pytest.raises(Exception, match="MatMulSwiGLU.*gate and up side by side"):
        swiglu_session(tmp_path, W)


@pytest.mark.parametrize("weights", ["bf16", "bf16dot"])
def test_swiglu_in_each_weight_format_is_its_matmul(tmp_path, weights):
    """In the bfloat16 formats too, MatMulSwiGLU is the same format's MatMul of x by [gate | up], then silu(gate) *
    up: bit for bit the product, the epilogue as in float32 (AMX or VDPBF16PS where the CPU has them)."""
    rng = np.random.default_rng(5)
    K, F = 160, 72
    W = rng.standard_normal((K, 2 * F), dtype=np.float32) * 0.2
    glu, mm = swiglu_session(tmp_path, W, weights=weights), session(tmp_path, W, [1, "M", K], weights=weights)
    for M in (1, 40, 300):
        x = rng.standard_normal((1, M, K), dtype=np.float32)
        gu = mm.run(None, {"A": x})[0][0].astype(np.float64)
        g, u = gu[:, :F], gu[:, F:]
        np.testing.assert_allclose(glu.run(None, {"A": x})[0][0], g / (1 + np.exp(-g)) * u, rtol=2e-6, atol=1e-6)


LEAK_PROBE = r"""
import sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from test_matmul_kernel import swiglu_session

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

W = np.random.default_rng(0).standard_normal((64, 96), dtype=np.float32) * 0.2
s = swiglu_session(Path(sys.argv[2]), W, weights=sys.argv[3])
x = np.random.default_rng(1).standard_normal((1, 8192, 64), dtype=np.float32)
def call():
    s.run(None, {"A": x})
def threads(n):
    for _ in range(n):
        t = threading.Thread(target=call)
        t.start()
        t.join()
threads(8)
before = rss()
threads(48)
print((rss() - before) / 2**20)
"""


@pytest.mark.parametrize("weights", ["float32", "bf16dot"])
def test_kept_buffers_leave_with_their_thread(tmp_path, weights):
    """The kernels keep their scratch per thread (a fresh mapping per call cost page faults); a caller thread's
    (onnxruntime's calling thread runs part of each call) is freed when that thread exits, so a service that runs
    each request on a thread of its own does not grow by a few MB per thread. 48 threads that each make one
    8,192-row MatMulSwiGLU call (kept buffers of ~1.5 MB per caller; in bf16dot the activation pairs and, on AMX,
    the whole product too) leave the process's RSS within 16 MB."""
    import os
    import subprocess
    import sys

    if weights == "bf16dot" and not kernels.matmul_dot(kernels.library(64)):
        pytest.skip("bf16dot needs a CPU with avx512_bf16")
    env = dict(os.environ, SPECEXPORT_MATMUL="1")
    r = subprocess.run([sys.executable, "-c", LEAK_PROBE, os.path.dirname(__file__), str(tmp_path), weights],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    grown = float(r.stdout.split()[-1])
    assert grown < 16, f"RSS grew {grown:.1f} MB over 48 short-lived threads: their kept buffers stayed behind"
