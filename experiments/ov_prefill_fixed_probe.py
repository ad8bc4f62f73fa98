"""Prefill on the OpenVINO backend with every profile compiled with fixed shapes (prefill chunks too) against
the default (decode and verify fixed, prefill dynamic): resident memory each pipeline adds, and the time to
feed prompts of 60, 150 and 400 random tokens, 5 interleaved rounds, medians.

    python experiments/ov_prefill_fixed_probe.py openvino-bf16|openvino-int4      (from the repository root)
"""
import sys, time, numpy as np, specexport
from specexport.backends import ov as ovb
from specexport.runtime.prefill import feed
backend = sys.argv[1]
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 // 10**6
r0 = rss()
dyn = specexport.load("bundles/smol-slots", threads=2, backend=backend)
r1 = rss()
ovb.fixed_ts = lambda root, e: sorted(set(e.profiles.values()))
fix = specexport.load("bundles/smol-slots", threads=2, backend=backend)
r2 = rss()
print(backend, "rss: default pipeline +%d MB, every profile fixed +%d MB (%s)" % (r1 - r0, r2 - r1, sorted(fix.target.fixed)))
rng = np.random.default_rng(0)
for n in (60, 150, 400):
    prompt = [int(x) for x in rng.integers(100, 40000, n)]
    t = {"default": [], "prefill fixed": []}
    for _ in range(5):
        for k, p in (("default", dyn), ("prefill fixed", fix)):
            c = p.target.new_cache(); c.reserve(n + 137)
            t0 = time.perf_counter(); lg, _ = feed(p.target, c, prompt); t[k].append(time.perf_counter() - t0)
            if k == "default": a = lg
    print(f"  {n} tokens: " + ", ".join(f"{k} {1e3*np.median(v):.0f} ms" for k, v in t.items()), "argmax same", int(a.argmax()) == int(lg.argmax()), flush=True)
