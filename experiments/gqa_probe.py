"""onnxruntime's CPU GroupQueryAttention alone (one node, 9/3 heads of 64 as SmolLM2): (1) does it take several
new tokens per row with a past at B > 1 (checked against numpy), (2) a 256-token chunk's time at a growing past.
  python experiments/gqa_probe.py"""
import sys, time, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto as TP
H, HKV, D, S = 9, 3, 64, 2048
def model():
    ins = [helper.make_tensor_value_info("q", TP.FLOAT, ["B", "T", H * D]),
           helper.make_tensor_value_info("k", TP.FLOAT, ["B", "T", HKV * D]),
           helper.make_tensor_value_info("v", TP.FLOAT, ["B", "T", HKV * D]),
           helper.make_tensor_value_info("pk", TP.FLOAT, ["B", HKV, S, D]),
           helper.make_tensor_value_info("pv", TP.FLOAT, ["B", HKV, S, D]),
           helper.make_tensor_value_info("sk", TP.INT32, ["B"]),
           helper.make_tensor_value_info("tot", TP.INT32, [])]
    outs = [helper.make_tensor_value_info("o", TP.FLOAT, ["B", "T", H * D]),
            helper.make_tensor_value_info("ok", TP.FLOAT, ["B", HKV, S, D]),
            helper.make_tensor_value_info("ov", TP.FLOAT, ["B", HKV, S, D])]
    n = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sk", "tot"], ["o", "ok", "ov"],
                         domain="com.microsoft", num_heads=H, kv_num_heads=HKV)
    g = helper.make_graph([n] * 1, "g", ins, outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()
so = ort.SessionOptions(); so.intra_op_num_threads = 2
sess = ort.InferenceSession(model(), so, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
def run(B, T, past):  # past: per-row committed lengths
    q = rng.standard_normal((B, T, H * D), dtype=np.float32); k = rng.standard_normal((B, T, HKV * D), dtype=np.float32)
    v = rng.standard_normal((B, T, HKV * D), dtype=np.float32)
    pk = rng.standard_normal((B, HKV, S, D), dtype=np.float32); pv = rng.standard_normal((B, HKV, S, D), dtype=np.float32)
    sk = np.array([p + T - 1 for p in past], np.int32); tot = np.array(max(past) + T, np.int32)
    io = sess.io_binding()
    for name, a in [("q", q), ("k", k), ("v", v), ("pk", pk), ("pv", pv), ("sk", sk), ("tot", tot)]:
        io.bind_cpu_input(name, a)
    io.bind_output("o"); 
    for o, a in [("ok", pk), ("ov", pv)]:
        io.bind_output(o, "cpu", 0, np.float32, a.shape, a.ctypes.data)
    t = time.perf_counter(); sess.run_with_iobinding(io); dt = time.perf_counter() - t
    return q, k, v, pk, pv, io.copy_outputs_to_cpu()[0], dt
def ref(q, k, v, pk, pv, past, T):  # causal attention of row b's T tokens over its past + new
    B = q.shape[0]; out = np.zeros_like(q)
    for b in range(B):
        n = past[b]
        K = pk[b, :, :n + T]; V = pv[b, :, :n + T]  # new tokens were written in place at n..n+T-1
        Q = q[b].reshape(T, H, D).transpose(1, 0, 2)
        Kh = np.repeat(K, H // HKV, 0); Vh = np.repeat(V, H // HKV, 0)
        s = Q @ Kh.transpose(0, 2, 1) / np.sqrt(D)
        s += np.where(np.arange(n + T)[None, :] <= (n + np.arange(T))[:, None], 0, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
        out[b] = (p @ Vh).transpose(1, 0, 2).reshape(T, H * D)
    return out
print("onnxruntime", ort.__version__)
for B, T, past in [(2, 3, [5, 9]), (4, 5, [0, 17, 3, 40]), (8, 9, [100, 7, 60, 1, 33, 250, 2, 80])]:
    try:
        q, k, v, pk, pv, o, dt = run(B, T, past)
        err = np.abs(o - ref(q, k, v, pk, pv, past, T)).max()
        print(f"B={B} T={T} past={past}: ok, max|err| {err:.2e}")
    except Exception as e:
        print(f"B={B} T={T} past={past}: refused: {str(e)[:200]}")
for n in [0, 512, 1024, 1280]:
    ts = [run(1, 256, [n])[-1] for _ in range(6)]
    print(f"prefill chunk T=256 at n={n}: {1e3*np.median(ts[1:]):.1f} ms per layer-op")
