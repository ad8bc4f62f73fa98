"""Does OpenVINO run a bundle's portable ONNX graph faster than onnxruntime on this CPU? (issue 17's first lever)

    python experiments/ov_graph_probe.py bundles/smol-portable [--repeats 8] [--precision f32|bf16]

Loads the target graph of a `--attention portable` bundle (standard ONNX ops; the fused graph's
com.microsoft GroupQueryAttention is onnxruntime's own) in both runtimes, 2 threads each, OpenVINO at
INFERENCE_PRECISION_HINT=f32 (or --precision), and times the same inputs interleaved (decode, verify, prefill; one row and
eight), printing the medians and the largest logit difference between the two.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openvino as ov

CALLS = [(1, 1, 256, 150), (1, 5, 256, 150), (1, 9, 256, 150), (1, 64, 128, 0), (8, 1, 256, 150), (8, 64, 128, 0)]


def feeds(arch: dict, B: int, T: int, S: int, n: int) -> dict:
    rng = np.random.default_rng(0)
    f = {"input_ids": rng.integers(0, 1000, (B, T)), "position_ids": (n + np.arange(T))[None].repeat(B, 0),
         "past_mask": np.broadcast_to(np.arange(S) < n, (B, S)).copy(),
         "new_mask": np.broadcast_to(np.tril(np.ones((T, T), bool)), (B, T, T)).copy()}
    for i in range(arch["num_layers"]):
        for k in ("key", "value"):
            f[f"past_{k}.{i}"] = 0.1 * rng.standard_normal((B, arch["num_kv_heads"], S, arch["head_dim"]),
                                                           dtype=np.float32)
    return f


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--precision", default="f32", help="OpenVINO's INFERENCE_PRECISION_HINT (f32, bf16)")
    a = p.parse_args()
    e = json.loads((Path(a.bundle) / "manifest.json").read_text())["models"]["target"]
    if e.get("attention") != "portable":
        raise SystemExit("needs a --attention portable bundle (standard ONNX ops)")
    path = str(Path(a.bundle) / e["graph"])
    cm = ov.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": a.precision, "INFERENCE_NUM_THREADS": "2",
                                               "PERFORMANCE_HINT": "LATENCY"})
    req = cm.create_infer_request()
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for B, T, S, n in CALLS:
        f = feeds(e["arch"], B, T, S, n)
        req.infer(f, share_inputs=True)
        d = float(np.abs(req.get_tensor("logits").data - sess.run(["logits"], f)[0]).max())
        t_ov, t_ort = [], []
        for _ in range(a.repeats):  # interleaved: both see the same machine
            t = time.perf_counter()
            req.infer(f, share_inputs=True)
            t_ov.append(time.perf_counter() - t)
            t = time.perf_counter()
            sess.run(None, f)
            t_ort.append(time.perf_counter() - t)
        ov_ms, ort_ms = 1e3 * np.median(t_ov), 1e3 * np.median(t_ort)
        print(f"B={B} T={T} S={S} n={n}: openvino {ov_ms:.1f} ms, onnxruntime {ort_ms:.1f} ms "
              f"(openvino/onnxruntime {ov_ms / ort_ms:.2f}), max|dlogit| {d:.1e}", flush=True)


if __name__ == "__main__":
    main()
