"""One layer's prefill-chunk attention two ways in onnxruntime, 30 layers chained: GroupQueryAttention (the fused
graph's node) against plain ops (Slice the past to n, MatMul + Add (causal bias) + Softmax + MatMul over exactly
the n+T slots, the G query heads of a KV head as G*T rows). SmolLM2 shapes: H=9, Hkv=3, D=64, S=2048.
    python experiments/ort_attention_ab.py T n1,n2,..
The GQA model here also returns its present outputs as copies (the runtime binds them to the past), so its
side is an upper bound: 171 ms at T = 256, n = 0 here against 101 ms for the 30 nodes in the fused graph's profile."""
import sys, time, statistics
import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as P
H, Hkv, D, S, L = 9, 3, 64, 2048, 30
G = H // Hkv
T = int(sys.argv[1]); ns = [int(x) for x in sys.argv[2].split(",")]
F = P.FLOAT

def so():
    o = ort.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return o

def gqa_model():
    ins = [h.make_tensor_value_info("q", F, [1, T, H * D]), h.make_tensor_value_info("k", F, [1, T, Hkv * D]),
           h.make_tensor_value_info("v", F, [1, T, Hkv * D]), h.make_tensor_value_info("seqlens_k", P.INT32, [1]),
           h.make_tensor_value_info("total_len", P.INT32, []), h.make_tensor_value_info("bias", F, [1, 1, T, "N"])]
    nodes, outs = [], []
    for i in range(L):
        ins += [h.make_tensor_value_info(f"pk{i}", F, [1, Hkv, S, D]), h.make_tensor_value_info(f"pv{i}", F, [1, Hkv, S, D])]
        nodes.append(h.make_node("GroupQueryAttention", ["q", "k", "v", f"pk{i}", f"pv{i}", "seqlens_k", "total_len",
                                 "", "", "", "bias"], [f"o{i}", f"ok{i}", f"ov{i}"], domain="com.microsoft",
                                 num_heads=H, kv_num_heads=Hkv, scale=1.0))
        outs += [h.make_tensor_value_info(f"o{i}", F, [1, T, H * D])]
        outs += [h.make_tensor_value_info(f"ok{i}", F, [1, Hkv, S, D]), h.make_tensor_value_info(f"ov{i}", F, [1, Hkv, S, D])]
    g = h.make_graph(nodes, "gqa", ins, outs)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])

def plain_model():
    # q [1,Hkv,G*T,D]; k, v [1,Hkv,T,D]; n int64 [1]; bias [T, n+T] (causal): per layer slice past to n
    ins = [h.make_tensor_value_info("q", F, [1, Hkv, G * T, D]), h.make_tensor_value_info("k", F, [1, Hkv, T, D]),
           h.make_tensor_value_info("v", F, [1, Hkv, T, D]), h.make_tensor_value_info("n", P.INT64, [1]),
           h.make_tensor_value_info("bias", F, [T, "N"])]
    init = [h.make_tensor("zero", P.INT64, [1], [0]), h.make_tensor("ax", P.INT64, [1], [2]),
            h.make_tensor("sh5", P.INT64, [5], [1, Hkv, G, T, -1]), h.make_tensor("sh4", P.INT64, [4], [1, Hkv, G * T, -1])]
    nodes, outs = [], []
    for i in range(L):
        ins += [h.make_tensor_value_info(f"pk{i}", F, [1, Hkv, S, D]), h.make_tensor_value_info(f"pv{i}", F, [1, Hkv, S, D])]
        nodes += [h.make_node("Slice", [f"pk{i}", "zero", "n", "ax"], [f"sk{i}"]),
                  h.make_node("Slice", [f"pv{i}", "zero", "n", "ax"], [f"sv{i}"]),
                  h.make_node("Concat", [f"sk{i}", "k"], [f"K{i}"], axis=2),
                  h.make_node("Concat", [f"sv{i}", "v"], [f"V{i}"], axis=2),
                  h.make_node("Transpose", [f"K{i}"], [f"Kt{i}"], perm=[0, 1, 3, 2]),
                  h.make_node("MatMul", ["q", f"Kt{i}"], [f"s{i}"]),
                  h.make_node("Reshape", [f"s{i}", "sh5"], [f"s5{i}"]),
                  h.make_node("Add", [f"s5{i}", "bias"], [f"sb{i}"]),
                  h.make_node("Softmax", [f"sb{i}"], [f"p{i}"], axis=-1),
                  h.make_node("Reshape", [f"p{i}", "sh4"], [f"p4{i}"]),
                  h.make_node("MatMul", [f"p4{i}", f"V{i}"], [f"o{i}"])]
        outs.append(h.make_tensor_value_info(f"o{i}", F, [1, Hkv, G * T, D]))
    g = h.make_graph(nodes, "plain", ins, outs, initializer=init)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])

rng = np.random.default_rng(0)
past = [rng.standard_normal((1, Hkv, S, D), dtype=np.float32) for _ in range(2 * L)]
sg = ort.InferenceSession(gqa_model().SerializeToString(), so(), providers=["CPUExecutionProvider"])
sp = ort.InferenceSession(plain_model().SerializeToString(), so(), providers=["CPUExecutionProvider"])
q = rng.standard_normal((1, T, H, D), dtype=np.float32) * 0.125
k = rng.standard_normal((1, T, Hkv, D), dtype=np.float32); v = rng.standard_normal((1, T, Hkv, D), dtype=np.float32)
for n in ns:
    N = n + T
    causal = np.triu(np.full((T, N), -np.inf, np.float32), k=n + 1)
    fg = {"q": q.reshape(1, T, H * D), "k": k.reshape(1, T, Hkv * D), "v": v.reshape(1, T, Hkv * D),
          "seqlens_k": np.array([N - 1], np.int32), "total_len": np.array(N, np.int32),
          "bias": np.zeros((1, 1, T, N), np.float32)}
    for i in range(L):
        fg[f"pk{i}"], fg[f"pv{i}"] = past[2 * i], past[2 * i + 1]
    qp = q.transpose(0, 2, 1, 3).reshape(1, Hkv, G * T, D)
    fp = {"q": np.ascontiguousarray(qp), "k": np.ascontiguousarray(k.transpose(0, 2, 1, 3)),
          "v": np.ascontiguousarray(v.transpose(0, 2, 1, 3)), "n": np.array([n], np.int64), "bias": causal}
    for i in range(L):
        fp[f"pk{i}"], fp[f"pv{i}"] = past[2 * i], past[2 * i + 1]
    og = sg.run(["o0"], fg)[0].reshape(1, T, H, D)
    op = sp.run(["o0"], fp)[0].reshape(1, Hkv, G, T, D).reshape(1, H, T, D).transpose(0, 2, 1, 3)
    # gqa wrote k,v into past in place? past arrays are inputs (copied outputs), so compare
    err = float(np.abs(og - op).max())
    tg, tp = [], []
    for r in range(5):
        for sess, feed, acc in ((sg, fg, tg), (sp, fp, tp)):
            t0 = time.perf_counter(); sess.run(["o0"] if sess is sp else ["o0"], feed); acc.append(time.perf_counter() - t0)
    print(f"T={T} n={n}: GQA {statistics.median(tg)*1e3:.1f} ms, plain ops {statistics.median(tp)*1e3:.1f} ms "
          f"({statistics.median(tg)/statistics.median(tp):.2f}x), max diff {err:.2e}", flush=True)
