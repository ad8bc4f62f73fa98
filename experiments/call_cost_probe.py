"""What a prefill call of T tokens costs per backend, as `a + b * T`: the call's fixed cost a in prompt tokens
(a / b) is what the prefill planner (runtime/prefill.py) weighs against padding.

    python experiments/call_cost_probe.py SLOTS_BUNDLE [FUSED_BUNDLE] [--rounds 5]

Each backend's target in one process (onnxruntime on FUSED_BUNDLE when given, OpenVINO f32 / bf16 / int4 on
SLOTS_BUNDLE), calls of T = 1, 64, 128, 256 new tokens at 128 cached ones (their cache reserved at 1,024),
interleaved backend by backend and T by T, `rounds` rounds; medians, then a least-squares line through them.
"""
import argparse
import os

import numpy as np

import specexport


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("slots")
    p.add_argument("fused", nargs="?")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    os.environ.setdefault("SPECEXPORT_OV_FIXED", "0")  # prefill calls run on the dynamic model anyway
    models = {b: specexport.load(a.slots, threads=2, backend=b).target
              for b in ("openvino", "openvino-bf16", "openvino-int4")}
    if a.fused:
        models = {"onnxruntime": specexport.load(a.fused, threads=2).target, **models}
    Ts = (1, 64, 128, 256)
    caches = {}
    for name, m in models.items():
        c = m.new_cache()
        c.reserve(1024)
        out = m.step(c, list(range(100, 228)), 0)
        c.commit(out.new_kv, range(128))
        caches[name] = c
    times = {(name, T): [] for name in models for T in Ts}
    for _ in range(a.rounds):
        for T in Ts:
            for name, m in models.items():
                times[name, T].append(m.step(caches[name], list(range(7, 7 + T)), 128, rows=[T - 1]).run_s)
    for name in models:
        ms = [1e3 * np.median(times[name, T]) for T in Ts]
        b, c = np.polyfit(Ts, ms, 1)
        print(f"{name:14s} " + "  ".join(f"T={T}: {x:6.1f} ms" for T, x in zip(Ts, ms))
              + f"  -> {c:.1f} ms + {b:.3f} ms/token: a call costs {c / b:.0f} tokens")


if __name__ == "__main__":
    main()
