"""One timed call of a fused target graph, as the kernel probes (gqa_kernel_ab.py, matmul_ab.py) make it; and
another git revision's kernel library (rev_library) to compare against."""
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specexport.backends.ort import fused_feeds


def fused_call(sess, cache, n, T, V, rows=None):
    """Rows at cache lengths n [B] get T new tokens (ids 1000 + 7 t), past and present bound to cache[:, :, rows]
    ([L, 2, rows, Hkv, S, D], written in place); logits of every new token (T <= 9) or of the last one.
    -> (seconds inside onnxruntime, logits [B, R, V])."""
    B, L = len(n), cache.shape[0]
    rows = slice(0, B) if rows is None else rows
    io = sess.io_binding()
    for i in range(L):
        for j, kind in enumerate(("key", "value")):
            ov = ort.OrtValue.ortvalue_from_numpy(cache[i, j, rows])
            io.bind_ortvalue_input(f"past_{kind}.{i}", ov)
            io.bind_ortvalue_output(f"present_{kind}.{i}", ov)
    ids = np.full((B, T), 1000, np.int64) + np.arange(T)[None] * 7
    f = fused_feeds(n, ids, n[:, None] + np.arange(T)[None], None)
    f["logit_rows"] = np.arange(T, dtype=np.int64) if T <= 9 else np.array([T - 1], np.int64)
    for k, v in f.items():
        io.bind_cpu_input(k, v)
    logits = np.empty((B, len(f["logit_rows"]), V), np.float32)
    io.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
    io.bind_output("top_ids")
    t = time.perf_counter()
    sess.run_with_iobinding(io)
    return time.perf_counter() - t, logits


def rev_library(rev: str) -> str:
    """The kernel library of git revision `rev` (its sources compiled as kernels.build does) -> its path."""
    from specexport import kernels

    tmp = Path(tempfile.mkdtemp())
    repo = kernels.HERE.parents[1]
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "specexport/kernels/"], capture_output=True,
                           text=True, check=True, cwd=repo).stdout.split()
    for path in names:  # REV's own sources (its .c and .h files), whatever this checkout's are
        if path.endswith((".c", ".h")):
            src = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, check=True, cwd=repo)
            (tmp / Path(path).name).write_bytes(src.stdout)
    out = str(tmp / "lib.so")
    subprocess.run([kernels.compiler(), *kernels.flags(), "-I", str(kernels.HERE / "include"), "-o", out,
                    *sorted(str(f) for f in tmp.glob("*.c")), "-lm"], check=True)
    return out
