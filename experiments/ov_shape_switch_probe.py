"""What a change of call shape costs on OpenVINO's dynamic model: a bf16 target's 1-token and 9-token calls run
in runs of one size, then alternating (as a speculating request's decode and verify calls, or the batching
engine's calls, do).

    python experiments/ov_shape_switch_probe.py BUNDLE [--backend openvino-bf16] [--rounds 12]

The slots bundle's target with SPECEXPORT_OV_FIXED=0 (every call on the dynamic model, as after the engine's
`drop_fixed`), 300 cached tokens; each round: 4 calls of T = 1, 4 of T = 9 (medians of the last 3), then 4
alternating pairs; medians over rounds.
"""
import argparse
import os

import numpy as np

import specexport
from specexport.runtime import prefill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--backend", default="openvino-bf16")
    p.add_argument("--rounds", type=int, default=12)
    a = p.parse_args()
    os.environ["SPECEXPORT_OV_FIXED"] = "0"
    m = specexport.load(a.bundle, threads=2, backend=a.backend).target
    c = m.new_cache()
    prefill.feed(m, c, list(range(100, 400)))

    def call(T: int) -> float:
        return m.step(c, list(range(7, 7 + T)), 300).run_s * 1e3

    res = {"T=1 in a run of T=1": [], "T=9 in a run of T=9": [], "T=1 after T=9": [], "T=9 after T=1": []}
    for _ in range(a.rounds):
        res["T=1 in a run of T=1"].append(np.median([call(1) for _ in range(4)][1:]))
        res["T=9 in a run of T=9"].append(np.median([call(9) for _ in range(4)][1:]))
        nine, one = [], []
        for _ in range(4):
            nine.append(call(9))
            one.append(call(1))
        res["T=9 after T=1"].append(np.median(nine[1:]))
        res["T=1 after T=9"].append(np.median(one))
    for k, v in res.items():
        print(f"{a.backend} {k:22s} {np.median(v):6.1f} ms")


if __name__ == "__main__":
    main()
