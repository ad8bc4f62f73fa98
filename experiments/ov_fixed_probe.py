"""What a dynamic shape costs OpenVINO's CPU plugin on a bundle's graph, and what fixing B and T buys end to end.

    python experiments/ov_fixed_probe.py BUNDLE [--precision bf16] [--rounds 25] [--prompts 4]

BUNDLE: a `--attention slots` bundle. (1) One process, three compiled models of the target graph at the given
INFERENCE_PRECISION_HINT, 2 threads: as read (every dim dynamic), fully static (B = 1, T = 1, S = 256), and
B, T fixed with S dynamic (what the backend compiles, `ov.fixed_shape`); the resident memory each compile
adds, then medians of interleaved 1-token calls at 100 cached tokens. (2) Two pipelines on the same bundle,
one loaded with SPECEXPORT_OV_FIXED=0: plain and recycle generations of a few chat prompts, interleaved,
two rounds, tokens/s medians, and whether each pipeline's recycle output equals its own plain output.
"""
import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import openvino as ov

import specexport
from specexport.backends.ov import fixed_shape, same_sigaltstack

PROMPTS = ["Write a short story about a robot learning to paint.",
           "Explain how a hash map works, with an example in Python.",
           "Summarize the causes of the French revolution in five bullet points.",
           "What are the health benefits of green tea?"]


def rss_mb() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 1e6


def calls(bundle: Path, precision: str, rounds: int) -> None:
    e = json.loads((bundle / "manifest.json").read_text())["models"]["target"]
    L, H, D = (e["arch"][k] for k in ("num_layers", "num_kv_heads", "head_dim"))
    S, n = 256, 100
    f = {"input_ids": np.ones((1, 1), np.int64), "position_ids": np.array([[n]], np.int64),
         "past_mask": (np.arange(S) < n)[None], "new_mask": np.ones((1, 1, 1), bool),
         "logit_rows": np.zeros(1, np.int64)}
    rng = np.random.default_rng(0)
    for i in range(L):
        for k in ("key", "value"):
            f[f"past_{k}.{i}"] = 0.5 * rng.standard_normal((1, H, S, D), dtype=np.float32)
    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}
    base = core.read_model(str(bundle / e["graph"]))
    models = {"dynamic": base, "static": base.clone(), "B,T fixed": fixed_shape(base, 1)}
    models["static"].reshape({k: ov.PartialShape(list(v.shape)) for k, v in f.items()})
    reqs = {}
    for name, m in models.items():
        r0 = rss_mb()
        with same_sigaltstack():
            reqs[name] = core.compile_model(m, "CPU", props).create_infer_request()
        for k, v in f.items():
            reqs[name].set_tensor(k, ov.Tensor(v, shared_memory=True))
        reqs[name].infer()
        print(f"{name}: compiled, +{rss_mb() - r0:.0f} MB resident")
    ts = {name: [] for name in reqs}
    for _ in range(rounds):
        for name, r in reqs.items():
            t = time.perf_counter()
            r.infer()
            ts[name].append(time.perf_counter() - t)
    print(f"{precision} 1-token call: " + ", ".join(f"{k} {1e3 * np.median(v):.1f} ms" for k, v in ts.items()))


def generations(bundle: Path, backend: str, prompts: int) -> None:
    os.environ["SPECEXPORT_OV_FIXED"] = "0"
    dynamic = specexport.load(bundle, threads=2, backend=backend)
    os.environ["SPECEXPORT_OV_FIXED"] = "1"
    fixed = specexport.load(bundle, threads=2, backend=backend)
    rate, outs = {}, {}
    for _ in range(2):
        for draft in ("none", "recycle"):
            for name, p in (("dynamic", dynamic), ("fixed", fixed)):
                toks, secs, out = 0, 0.0, []
                for q in PROMPTS[:prompts]:
                    t = time.perf_counter()
                    g = p.generate(q, max_new_tokens=96, draft=draft, chat=True)
                    secs += time.perf_counter() - t
                    toks += len(g.token_ids)
                    out.append(g.token_ids)
                rate.setdefault((draft, name), []).append(toks / secs)
                outs[draft, name] = out
    for draft in ("none", "recycle"):
        a, b = np.median(rate[draft, "dynamic"]), np.median(rate[draft, "fixed"])
        print(f"{backend} {draft}: dynamic {a:.1f} tokens/s, fixed {b:.1f} ({b / a:.2f}x)")
    for name in ("dynamic", "fixed"):
        print(f"{name}: recycle output identical to its plain output: {outs['recycle', name] == outs['none', name]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--prompts", type=int, default=4)
    a = p.parse_args()
    calls(a.bundle, a.precision, a.rounds)
    generations(a.bundle, {"bf16": "openvino-bf16", "f32": "openvino"}[a.precision], a.prompts)


if __name__ == "__main__":
    main()
