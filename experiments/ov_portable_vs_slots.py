"""The slots graph against the portable one on OpenVINO: a decode call and a verify call per backend, and what
the load-time check measures for each.

    python experiments/ov_portable_vs_slots.py SLOTS_BUNDLE PORTABLE_BUNDLE [--backends openvino-int4,...]
        [--cached 300] [--rounds 15]

The slots graph writes each new token's K/V into a copy of the cache (a Select over all S slots per layer,
K and V), so that a verify row sums its keys exactly as a decode row does; the portable graph attends over
[cache; new tokens] with no copy, and rounds the two halves' sums apart. Both targets of a backend in one
process (fixed-shape models as the backend loads them), calls of T = 1 and the largest verify T at `cached`
committed tokens, interleaved, `rounds` rounds; medians.
"""
import argparse

import numpy as np

import specexport
from specexport.runtime import prefill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("slots")
    p.add_argument("portable")
    p.add_argument("--backends", default="openvino-int4,openvino-bf16,openvino")
    p.add_argument("--cached", type=int, default=300)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    for b in a.backends.split(","):
        models = {name: specexport.load(path, threads=2, backend=b).target
                  for name, path in (("slots", a.slots), ("portable", a.portable))}
        caches, Ts = {}, (1, max(models["slots"].fixed or [9]))
        for name, m in models.items():
            e = m.entry
            print(f"{b:14s} {name:8s} at load: verify drift {e.verify_drift:.3g}, speculative {e.speculative}, "
                  f"trees {e.exact_trees}", flush=True)
            c = m.new_cache()
            c.reserve(a.cached + 16)
            ids = [int(x) for x in np.random.RandomState(0).randint(100, 40000, a.cached)]
            prefill.feed(m, c, ids)
            caches[name] = c
        times = {(name, T): [] for name in models for T in Ts}
        for _ in range(a.rounds):
            for T in Ts:
                for name, m in models.items():
                    times[name, T].append(m.step(caches[name], list(range(7, 7 + T)), a.cached).run_s)
        for T in Ts:
            s, q = (1e3 * np.median(times[name, T]) for name in ("slots", "portable"))
            print(f"{b:14s} T={T}: slots {s:.1f} ms, portable {q:.1f} ms ({s / q:.2f}x) at S = "
                  f"{caches['slots'].S}", flush=True)


if __name__ == "__main__":
    main()
