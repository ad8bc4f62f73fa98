"""A batched decode call's attention (B rows, one new token each, rows at different cache lengths) two ways in
onnxruntime, 30 layers side by side: GroupQueryAttention as the fused graph runs it (past and present bound to
one buffer, attn_bias input) against plain ops over the whole bucket S (the portable graph's form: the G query
heads of a KV head as G rows, scores against the cache and the new token concatenated, a mask bias, Softmax,
two MatMuls; the new K/V left for the host to commit). SmolLM2 shapes: H=9, Hkv=3, D=64.
    python experiments/decode_attention_ab.py B S n_lo,n_hi [ROUNDS]
Rows sit at cache lengths spread evenly over [n_lo, n_hi]."""
import statistics, sys, time
import numpy as np, onnxruntime as ort
from onnx import helper as h, TensorProto as P

H, Hkv, D, L = 9, 3, 64, 30
G = H // Hkv
B, S = int(sys.argv[1]), int(sys.argv[2])
lo, hi = (int(x) for x in sys.argv[3].split(","))
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 15
F = P.FLOAT


def so():
    o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return o


def model(nodes, ins, outs, init=()):
    g = h.make_graph(nodes, "m", ins, outs, initializer=list(init))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]).SerializeToString()


def gqa_model():
    ins = [h.make_tensor_value_info("q", F, [B, 1, H * D]), h.make_tensor_value_info("k", F, [B, 1, Hkv * D]),
           h.make_tensor_value_info("v", F, [B, 1, Hkv * D]), h.make_tensor_value_info("seqlens_k", P.INT32, [B]),
           h.make_tensor_value_info("total_len", P.INT32, []), h.make_tensor_value_info("bias", F, [B, 1, 1, "N"])]
    nodes, outs = [], []
    for i in range(L):
        ins += [h.make_tensor_value_info(f"pk{i}", F, [B, Hkv, S, D]), h.make_tensor_value_info(f"pv{i}", F, [B, Hkv, S, D])]
        nodes.append(h.make_node("GroupQueryAttention", ["q", "k", "v", f"pk{i}", f"pv{i}", "seqlens_k", "total_len",
                                 "", "", "", "bias"], [f"o{i}", f"ok{i}", f"ov{i}"], domain="com.microsoft",
                                 num_heads=H, kv_num_heads=Hkv, scale=1.0))
        outs += [h.make_tensor_value_info(f"o{i}", F, [B, 1, H * D]),
                 h.make_tensor_value_info(f"ok{i}", F, [B, Hkv, S, D]), h.make_tensor_value_info(f"ov{i}", F, [B, Hkv, S, D])]
    return model(nodes, ins, outs)


def plain_model():
    ins = [h.make_tensor_value_info("q", F, [B, Hkv, G, D]), h.make_tensor_value_info("k", F, [B, Hkv, 1, D]),
           h.make_tensor_value_info("v", F, [B, Hkv, 1, D]), h.make_tensor_value_info("bias", F, [B, 1, 1, S + 1])]
    init = [h.make_tensor("split", P.INT64, [2], [S, 1])]
    nodes, outs = [], []
    for i in range(L):
        ins += [h.make_tensor_value_info(f"pk_{i}", F, [B, Hkv, S, D]), h.make_tensor_value_info(f"pv_{i}", F, [B, Hkv, S, D])]
        nodes += [h.make_node("Transpose", [f"pk_{i}"], [f"kt_{i}"], perm=[0, 1, 3, 2]),
                  h.make_node("MatMul", ["q", f"kt_{i}"], [f"s1_{i}"]),
                  h.make_node("Transpose", ["k"], [f"knt_{i}"], perm=[0, 1, 3, 2]),
                  h.make_node("MatMul", ["q", f"knt_{i}"], [f"s2_{i}"]),
                  h.make_node("Concat", [f"s1_{i}", f"s2_{i}"], [f"s_{i}"], axis=-1),
                  h.make_node("Add", [f"s_{i}", "bias"], [f"sb_{i}"]),
                  h.make_node("Softmax", [f"sb_{i}"], [f"p_{i}"], axis=-1),
                  h.make_node("Split", [f"p_{i}", "split"], [f"p1_{i}", f"p2_{i}"], axis=-1),
                  h.make_node("MatMul", [f"p1_{i}", f"pv_{i}"], [f"o1_{i}"]),
                  h.make_node("MatMul", [f"p2_{i}", "v"], [f"o2_{i}"]),
                  h.make_node("Add", [f"o1_{i}", f"o2_{i}"], [f"o_{i}"])]
        outs.append(h.make_tensor_value_info(f"o_{i}", F, [B, Hkv, G, D]))
    return model(nodes, ins, outs, init)


rng = np.random.default_rng(0)
n = np.linspace(lo, hi, B).astype(np.int64)
assert n.max() < S
past = [rng.standard_normal((B, Hkv, S, D), dtype=np.float32) for _ in range(2 * L)]
q = rng.standard_normal((B, 1, H, D), dtype=np.float32) * 0.125
k = rng.standard_normal((B, 1, Hkv, D), dtype=np.float32)
v = rng.standard_normal((B, 1, Hkv, D), dtype=np.float32)

sg = ort.InferenceSession(gqa_model(), so(), providers=["CPUExecutionProvider"])
io = sg.io_binding()
N = int(n.max()) + 1
bias = np.full((B, 1, 1, N), -np.inf, np.float32)
for b in range(B):
    bias[b, 0, 0, :n[b] + 1] = 0.0
for name, val in (("q", q.reshape(B, 1, H * D)), ("k", k.reshape(B, 1, Hkv * D)), ("v", v.reshape(B, 1, Hkv * D)),
                  ("seqlens_k", n.astype(np.int32)), ("total_len", np.array(N, np.int32)), ("bias", bias)):
    io.bind_cpu_input(name, np.ascontiguousarray(val))
gpast = [ort.OrtValue.ortvalue_from_numpy(p.copy()) for p in past]
for i in range(L):
    io.bind_ortvalue_input(f"pk{i}", gpast[2 * i]); io.bind_ortvalue_input(f"pv{i}", gpast[2 * i + 1])
    io.bind_ortvalue_output(f"ok{i}", gpast[2 * i]); io.bind_ortvalue_output(f"ov{i}", gpast[2 * i + 1])
    io.bind_output(f"o{i}")

sp = ort.InferenceSession(plain_model(), so(), providers=["CPUExecutionProvider"])
pbias = np.full((B, 1, 1, S + 1), -np.inf, np.float32)
for b in range(B):
    pbias[b, 0, 0, :n[b]] = 0.0
    pbias[b, 0, 0, S] = 0.0
fp = {"q": np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, Hkv, G, D)),
      "k": np.ascontiguousarray(k.transpose(0, 2, 1, 3)), "v": np.ascontiguousarray(v.transpose(0, 2, 1, 3)), "bias": pbias}
for i in range(L):
    fp[f"pk_{i}"], fp[f"pv_{i}"] = past[2 * i], past[2 * i + 1]

sg.run_with_iobinding(io)
og = io.copy_outputs_to_cpu()[2].reshape(B, H, D)
op = sp.run(["o_0"], fp)[0].reshape(B, H, D)
err = float(np.abs(og - op).max())
tg, tp = [], []
for r in range(ROUNDS):
    t0 = time.perf_counter(); sg.run_with_iobinding(io); tg.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); sp.run(["o_0"], fp); tp.append(time.perf_counter() - t0)
mg, mp = statistics.median(tg[2:]) * 1e3, statistics.median(tp[2:]) * 1e3
mb = sum(int(x) + 1 for x in n) * Hkv * D * 4 * 2 * L / 1e6
print(f"B={B} S={S} n={lo}..{hi}: GQA {mg:.2f} ms ({mb / mg:.1f} GB/s of the rows' K/V), plain over S {mp:.2f} ms "
      f"({mg / mp:.2f}x), max diff {err:.2e}", flush=True)
