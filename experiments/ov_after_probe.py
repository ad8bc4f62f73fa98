"""Do onnxruntime's calls run slower in a process where OpenVINO's CPU plugin has compiled a model (as the bench's
ov-cb peer did, in the bench's own process, until 2026-12-07)?

    python experiments/ov_after_probe.py BUNDLE OV_MODEL_DIR [--seconds 8]

Times the bundle target's (8, 1) decode call at 256 cached tokens (medians over --seconds of back-to-back calls,
each phase twice): before anything of OpenVINO; after a child process compiled OV_MODEL_DIR into a
ContinuousBatchingPipeline and ran two requests on it; after importing openvino and openvino_genai here; after the
same compile here; after it ran the two requests; after it was deleted.
"""
import argparse
import gc
import statistics
import subprocess
import sys
import time

import numpy as np

import specexport

CHILD = """
import numpy as np, openvino as ov, openvino_genai as og
sc = og.SchedulerConfig(); sc.max_num_seqs, sc.cache_size, sc.dynamic_split_fuse = 8, 1, True
p = og.ContinuousBatchingPipeline({model!r}, sc, "CPU", {props!r})
g = og.GenerationConfig(); g.max_new_tokens = 16
hs = [p.add_request(i, ov.Tensor(np.array([list(range(100, 300))], dtype=np.int64)), g) for i in range(2)]
while p.has_non_finished_requests():
    p.step()
"""
PROPS = {"INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("ov_model")
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    t = specexport.load(a.bundle, threads=2).target
    pool = t.new_pool(8)
    pool.n[:8] = 256
    ids, pos = np.ones((8, 1), np.int64), pool.n[:8].reshape(8, 1).astype(np.int64).copy()

    def phase(label):
        for _ in range(2):
            t0, xs = time.perf_counter(), []
            while time.perf_counter() - t0 < a.seconds:
                xs.append(t.step_batch(pool, ids, pos).run_s)
            print(f"{label:34s} (8, 1) call median {statistics.median(xs) * 1e3:6.2f} ms over {len(xs)} calls",
                  flush=True)

    phase("before OpenVINO")
    subprocess.run([sys.executable, "-c", CHILD.format(model=a.ov_model, props=PROPS)], check=True)
    phase("after a compile in a child process")
    import openvino as ov
    import openvino_genai as og
    phase("after the import")
    sc = og.SchedulerConfig()
    sc.max_num_seqs, sc.cache_size, sc.dynamic_split_fuse = 8, 1, True
    p = og.ContinuousBatchingPipeline(a.ov_model, sc, "CPU", PROPS)
    phase("after a compile here")
    g = og.GenerationConfig()
    g.max_new_tokens = 16
    hs = [p.add_request(i, ov.Tensor(np.array([list(range(100, 300))], dtype=np.int64)), g) for i in range(2)]
    while p.has_non_finished_requests():
        p.step()
    phase("after it ran")
    del hs, p
    gc.collect()
    phase("after it was deleted")


if __name__ == "__main__":
    main()
