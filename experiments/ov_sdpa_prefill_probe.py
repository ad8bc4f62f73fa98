"""Prefill on the OpenVINO backend with each layer's attention rewritten as OpenVINO's ScaledDotProductAttention
node (ov_sdpa_probe.fuse_attention: explicit mask, not causal) against the graph as built: time to feed
prompts of 200, 800 and 1,500 random tokens (cache reserved as a generation does), 3 interleaved rounds,
medians, and the largest difference of the first token's logits.

    python experiments/ov_sdpa_prefill_probe.py bf16|f32|int4      (run from the repository root)
"""
import os, sys, time, numpy as np
os.environ["SPECEXPORT_OV_FIXED"] = "0"
sys.path.insert(0, "experiments")
import openvino as ov, specexport
from pathlib import Path
from ov_sdpa_probe import fuse_attention
from specexport.backends.ov import compress_weights, same_sigaltstack
from specexport.runtime.prefill import feed
prec = sys.argv[1]
kind = {"f32": "openvino", "bf16": "openvino-bf16", "int4": "openvino-int4"}[prec]
B = "bundles/smol-slots"
models = [specexport.load(B, threads=2, backend=kind).target for _ in range(2)]
m = models[1]; core = ov.Core()
g = core.read_model(str(Path(B) / m.entry.graph))
if prec == "int4": compress_weights(g, m.entry.arch["head_dim"], m.entry.arch["vocab_size"])
print(fuse_attention(g), "fused")
with same_sigaltstack():
    m.compiled = core.compile_model(g, "CPU", {"INFERENCE_PRECISION_HINT": "f32" if prec == "int4" else prec, "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"})
rng = np.random.default_rng(0)
for n in (200, 800, 1500):
    prompt = [int(x) for x in rng.integers(100, 40000, n)]
    t = [[], []]; lg = [None, None]
    for _ in range(3):
        for j, x in enumerate(models):
            c = x.new_cache(); c.reserve(n + 137)
            t0 = time.perf_counter(); lg[j], _ = feed(x, c, prompt); t[j].append(time.perf_counter() - t0)
    print(f"{prec} {n}: as built {np.median(t[0]):.3f} s, SDPA {np.median(t[1]):.3f} s ({np.median(t[0])/np.median(t[1]):.2f}x), max|dlogit| {np.abs(lg[0]-lg[1]).max():.3g}", flush=True)
