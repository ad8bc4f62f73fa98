"""Would OpenVINO's fused attention make our slots graph's OpenVINO step cheaper, and keep chains exact?

    python experiments/ov_sdpa_probe.py BUNDLE [--precision bf16|f32|int4] [--rounds 15]

BUNDLE: a `--attention slots` bundle. Loads its target on the OpenVINO backend twice: as built, and with each
layer's attention, MatMul(q, K^T) + bias -> Softmax -> MatMul(., V), rewritten as one ScaledDotProductAttention
node (scale 1: q is pre-scaled), which the CPU plugin runs with its own kernel. For each: the verify-vs-decode
drift of a chain and a tree (prefill.verify_drifts, the load-time check) and the median call times at T = 1,
5, 9 with 192 cached tokens, interleaved.
"""
import argparse
import os
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops

import specexport
from specexport.backends.ov import compress_weights, same_sigaltstack
from specexport.runtime.prefill import verify_drifts


def fuse_attention(model) -> int:
    done = 0
    for sm in model.get_ordered_ops():
        if sm.get_type_name() != "Softmax":
            continue
        add = sm.input_value(0).get_node()
        if add.get_type_name() != "Add":
            continue
        qk = add.input_value(0).get_node()
        bias = add.input_value(1)
        if qk.get_type_name() != "MatMul":
            qk, bias = add.input_value(1).get_node(), add.input_value(0)
        if qk.get_type_name() != "MatMul":
            continue
        q, k = qk.input_value(0), qk.input_value(1)
        if not qk.get_attributes()["transpose_b"]:
            t = k.get_node()
            if t.get_type_name() != "Transpose":
                continue
            k = t.input_value(0)
        outs = [i.get_node() for i in sm.output(0).get_target_inputs()]
        if len(outs) != 1 or outs[0].get_type_name() != "MatMul":
            continue
        pv = outs[0]
        v = pv.input_value(1)
        sdpa = ops.scaled_dot_product_attention(q, k, v, bias, ops.constant(np.float32(1.0)), causal=False)
        pv.output(0).replace(sdpa.output(0))
        done += 1
    return done


def main() -> None:
    os.environ["SPECEXPORT_OV_FIXED"] = "0"  # the probe swaps the dynamic model's graph: every call must run on it
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    kind = {"f32": "openvino", "bf16": "openvino-bf16", "int4": "openvino-int4"}[a.precision]
    models = [specexport.load(a.bundle, backend=kind).target for _ in range(2)]
    m = models[1]
    core = ov.Core()
    g = core.read_model(str(Path(a.bundle) / m.entry.graph))
    if a.precision == "int4":
        compress_weights(g, m.entry.arch["head_dim"], m.entry.arch["vocab_size"])
    n = fuse_attention(g)
    props = {"INFERENCE_PRECISION_HINT": "f32" if a.precision == "int4" else a.precision,
             "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}
    with same_sigaltstack():
        m.compiled = core.compile_model(g, "CPU", props)
    print(f"{n} attention blocks fused")
    caches = []
    for label, x in zip(("as built", "fused SDPA"), models):
        print(label, "drift chain / tree:", verify_drifts(x), verify_drifts(x, 1))
        c, ids, k = x.new_cache(), list(range(100, 400)), 0
        while k + 64 <= 192:
            out = x.step(c, ids[k:k + 64], k)
            c.commit(out.new_kv, list(range(64)))
            k += 64
        caches.append(c)
    ts = {(j, T): [] for j in range(2) for T in (1, 5, 9)}
    for _ in range(a.rounds):
        for j, x in enumerate(models):
            for T in (1, 5, 9):
                ts[j, T].append(x.step(caches[j], list(range(7, 7 + T)), caches[j].n).run_s)
    for j, label in enumerate(("as built", "fused SDPA")):
        print(label, "  ".join(f"T={T}: {np.median(ts[j, T]) * 1e3:.2f} ms" for T in (1, 5, 9)))


if __name__ == "__main__":
    main()
