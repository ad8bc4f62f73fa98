"""What a verify call of T tokens costs against a 1-token call, per backend (how cheap an extra verify row is).

    python experiments/verify_rows_probe.py BUNDLE [BACKEND] [--rounds 15]

Loads the bundle's target on BACKEND (default onnxruntime; openvino, openvino-bf16, openvino-int4 for a slots
bundle), prefills 192 tokens, then times calls of T = 1, 3, 5, 9 new tokens against that cache, round-robin,
and prints the medians of the seconds inside the backend (StepOut.run_s). One backend per process: two
runtimes' thread pools in one process disturb each other's timings.
"""
import argparse

import numpy as np

import specexport


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("backend", nargs="?", default="onnxruntime")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    m = specexport.load(a.bundle, backend=a.backend).target
    cache, ids, n = m.new_cache(), list(range(100, 400)), 0
    while n + 64 <= 192:
        out = m.step(cache, ids[n:n + 64], n)
        cache.commit(out.new_kv, list(range(64)))
        n += 64
    ts = {T: [] for T in (1, 3, 5, 9) if T in m.profile_ts}
    for _ in range(a.rounds):
        for T in ts:
            ts[T].append(m.step(cache, ids[:T], cache.n).run_s)
    one = np.median(ts[1])
    print(a.bundle, a.backend, "  ".join(f"T={T}: {np.median(v) * 1e3:.2f} ms ({np.median(v) / one:.2f}x)"
                                          for T, v in ts.items()))


if __name__ == "__main__":
    main()
