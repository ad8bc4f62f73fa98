"""Does a bfloat16 cache make the OpenVINO backend's bfloat16 step cheaper, and does it change its numerics?

    python experiments/ov_bf16_cache_probe.py bundles/smol-slots [--repeats 15]

The OpenVINO backend passes a float32 RingKV as the past inputs; in bfloat16 the plugin converts every past
input to bfloat16 on every call (read 4 bytes, write 2, per cached value) before attention reads it. Here the
same slots graph is compiled a second time with its past inputs and its new_kv output declared bfloat16
(PrePostProcessor: the caller's tensor is bfloat16, so no conversion is left in the graph), fed a uint16 copy
of the same cache (the float32 cache's values are bfloat16 values: checked). Prints, per (T, cached tokens),
the median call times of both (interleaved) and the largest logit difference between them (0.0 = the same
target).
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np
import openvino as ov

PROPS = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}


def to_bf16(a: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return (u >> 16).astype(np.uint16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    e = json.loads((Path(a.bundle) / "manifest.json").read_text())["models"]["target"]
    path = str(Path(a.bundle) / e["graph"])
    L, H, D, V = (e["arch"][k] for k in ("num_layers", "num_kv_heads", "head_dim", "vocab_size"))
    core = ov.Core()
    f32 = core.compile_model(path, "CPU", PROPS)
    model = core.read_model(path)
    pp = ov.preprocess.PrePostProcessor(model)
    kv = [f"past_{k}.{i}" for i in range(L) for k in ("key", "value")]
    for name in kv:
        pp.input(name).tensor().set_element_type(ov.Type.bf16)
    pp.output("new_kv").tensor().set_element_type(ov.Type.bf16)
    b16 = core.compile_model(pp.build(), "CPU", PROPS)
    r32, r16 = f32.create_infer_request(), b16.create_infer_request()
    rng = np.random.default_rng(0)
    for S, n in ((256, 100), (512, 400), (1024, 900)):
        # random keys/values rounded to bfloat16 (what a bfloat16 model's new_kv holds: checked below)
        cache = np.zeros((L, 2, 1, H, S, D), np.float32)
        ids = rng.integers(0, V, n + 9)
        cache[:, :, :, :, :n] = 0.5 * rng.standard_normal((L, 2, 1, H, n, D), dtype=np.float32)
        cache = (to_bf16(cache).astype(np.uint32) << 16).view(np.float32)
        c16 = to_bf16(cache)
        for i, name in enumerate(kv):
            r32.set_tensor(name, ov.Tensor(cache[i // 2, i % 2], shared_memory=True))
            r16.set_tensor(name, ov.Tensor(c16[i // 2, i % 2], list(c16.shape[2:]), ov.Type.bf16))
        for T in (1, 5, 9):
            if T not in set(e["profiles"].values()):
                continue
            f = {"input_ids": ids[n:n + T][None].astype(np.int64),
                 "position_ids": (n + np.arange(T))[None].astype(np.int64),
                 "past_mask": (np.arange(S) < n)[None], "new_mask": np.tril(np.ones((T, T), bool))[None].copy(),
                 "logit_rows": np.arange(T, dtype=np.int64)}
            for name, x in f.items():
                r32.set_tensor(name, ov.Tensor(x))
                r16.set_tensor(name, ov.Tensor(x))
            r32.infer()
            r16.infer()
            l32, l16 = r32.get_tensor("logits").data.copy(), r16.get_tensor("logits").data.copy()
            kv32 = r32.get_tensor("new_kv").data
            exact_kv = bool(np.all(kv32.view(np.uint32) & 0xFFFF == 0))
            same_kv = bool(np.array_equal(to_bf16(kv32), r16.get_tensor("new_kv").data.view(np.uint16)))
            t32, t16 = [], []
            for _ in range(a.repeats):
                t = time.perf_counter()
                r32.infer()
                t32.append(time.perf_counter() - t)
                t = time.perf_counter()
                r16.infer()
                t16.append(time.perf_counter() - t)
            m32, m16 = np.median(t32) * 1e3, np.median(t16) * 1e3
            print(f"S={S:5d} n={n:4d} T={T}: f32 cache {m32:6.2f} ms  bf16 cache {m16:6.2f} ms  ({m32 / m16:.2f}x)  "
                  f"max|dlogit| {float(np.abs(l32 - l16).max()):.3g}  new_kv bf16-exact {exact_kv} same {same_kv}",
                  flush=True)


if __name__ == "__main__":
    main()
