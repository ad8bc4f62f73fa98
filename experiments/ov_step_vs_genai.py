"""Our slots graph's bfloat16 decode call on OpenVINO against OpenVINO GenAI's own IR, and with the weights in
OpenVINO's [N, K] layout (MatMul transpose_b, as its IR has them).

    python experiments/ov_step_vs_genai.py BUNDLE OV_IR_DIR [--precision bf16] [--rounds 30]

BUNDLE: a `--attention slots` bundle; OV_IR_DIR: `optimum-cli export openvino --weight-format fp32` of the
same checkpoint. Three infer requests in one process, interleaved call by call at ~100 cached tokens: the
bundle's graph as read, the same with every weight MatMul rewritten to MatMul(x, W^T, transpose_b=True), and
the IR (stateful, its cache inside the plugin), all at the given INFERENCE_PRECISION_HINT, 2 threads.
Prints the medians and the largest logit difference between the first two (0.0: the same math).
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import openvino as ov
from openvino import opset13 as ops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("ir")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--rounds", type=int, default=30)
    a = p.parse_args()
    e = json.loads((Path(a.bundle) / "manifest.json").read_text())["models"]["target"]
    L, H, D = (e["arch"][k] for k in ("num_layers", "num_kv_heads", "head_dim"))
    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": a.precision, "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}

    def ours(transposed: bool):
        m = core.read_model(str(Path(a.bundle) / e["graph"]))
        for op in m.get_ordered_ops() if transposed else []:
            w = op.input_value(1).get_node() if op.get_type_name() == "MatMul" else None
            if w is None or w.get_type_name() != "Constant" or op.get_attributes()["transpose_b"] \
                    or w.get_data().ndim != 2:
                continue
            new = ops.matmul(op.input_value(0), ops.constant(np.ascontiguousarray(w.get_data().T)), False, True)
            op.output(0).replace(new.output(0))
        return core.compile_model(m, "CPU", props).create_infer_request()

    reqs = [ours(False), ours(True)]
    ir = core.compile_model(str(Path(a.ir) / "openvino_model.xml"), "CPU",
                            {**props, "KV_CACHE_PRECISION": a.precision}).create_infer_request()
    S, n = 256, 100
    f = {"input_ids": np.ones((1, 1), np.int64), "position_ids": np.array([[n]], np.int64),
         "past_mask": (np.arange(S) < n)[None], "new_mask": np.ones((1, 1, 1), bool),
         "logit_rows": np.zeros(1, np.int64)}
    rng = np.random.default_rng(0)
    for i in range(L):
        for k in ("key", "value"):
            f[f"past_{k}.{i}"] = 0.5 * rng.standard_normal((1, H, S, D), dtype=np.float32)
    logits = []
    for r in reqs:
        for name, x in f.items():
            r.set_tensor(name, ov.Tensor(x, shared_memory=True))
        r.infer()
        logits.append(r.get_tensor("logits").data.copy())
    ir.infer({"input_ids": np.ones((1, n), np.int64), "attention_mask": np.ones((1, n), np.int64),
              "position_ids": np.arange(n)[None], "beam_idx": np.zeros(1, np.int32)})
    ts = [[], [], []]
    for i in range(a.rounds):
        for j, r in enumerate(reqs):
            t = time.perf_counter()
            r.infer()
            ts[j].append(time.perf_counter() - t)
        g = {"input_ids": np.ones((1, 1), np.int64), "attention_mask": np.ones((1, n + 1 + i), np.int64),
             "position_ids": np.array([[n + i]]), "beam_idx": np.zeros(1, np.int32)}
        t = time.perf_counter()
        ir.infer(g)
        ts[2].append(time.perf_counter() - t)
    print(f"{a.precision} decode call, ms: our graph {np.median(ts[0]) * 1e3:.1f}, weights transposed "
          f"{np.median(ts[1]) * 1e3:.1f} (max |dlogit| {float(np.abs(logits[0] - logits[1]).max()):.3g}), "
          f"OpenVINO GenAI's IR {np.median(ts[2]) * 1e3:.1f}")


if __name__ == "__main__":
    main()
