"""An int4 draft's calls on onnxruntime's MatMulNBits (its int8-activation path, the draft's level 4) against
specexport's (kernels/matmul4.c, specexport.matmul_nbits=int8): the bundle's draft graph loaded twice in one
process, (B, 1) decode calls at 300+ cached tokens and a 64-token chunk, interleaved (order swapped each round),
medians; first, each one's rows of a 4-row call against the same rows alone (max |logit diff|). With --against
REV, the other side is specexport's kernel of git revision REV instead of onnxruntime's (and the logits of the
two sides are compared too).
    python experiments/draft_calls_ab.py BUNDLE [ROUNDS] [--against REV]   (default 15 rounds)"""
import collections
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from fused_calls import fused_call, rev_library  # experiments/
from specexport import kernels
from specexport.backends.ort import session_options

args = [x for x in sys.argv[1:] if not x.startswith("--against")]
against = next((x.split("=", 1)[1] for x in sys.argv[1:] if x.startswith("--against=")), None)
root = Path(args[0])
R = int(args[1]) if len(args) > 1 else 15
m = json.loads((root / "manifest.json").read_text())["models"]["draft"]
arch = m["arch"]
L, Hkv, D, V, S = arch["num_layers"], arch["num_kv_heads"], arch["head_dim"], arch["vocab_size"], 2048
lib = kernels.library(D)
assert lib and kernels.matmul4_on(lib), "specexport's int4 kernel does not build here"
other = f"specexport@{against}" if against else "onnxruntime"
libs = {other: rev_library(against) if against else lib, "specexport": lib}
sess = {w: ort.InferenceSession(str(root / m["graph"]), session_options(2, libs[w], "float32", w != "onnxruntime"),
                                providers=["CPUExecutionProvider"]) for w in (other, "specexport")}
base = np.random.default_rng(0).standard_normal((L, 2, 16, Hkv, S, D), dtype=np.float32) * 0.5
cache = {w: base.copy() for w in sess}
n4 = 300 + 7 * np.arange(4)
for w, s in sess.items():
    batch = fused_call(s, cache[w], n4, 1, V)[1]
    alone = [fused_call(s, cache[w], n4[b:b + 1], 1, V, slice(b, b + 1))[1][0] for b in range(4)]
    print(f"{w}: rows of a (4, 1) call against each alone, max |logit diff| "
          + " ".join(f"{float(np.abs(batch[b] - alone[b]).max()):.3g}" for b in range(4)))
cases = [(1, 1), (2, 1), (4, 1), (8, 1), (16, 1), (1, 64)]
t = collections.defaultdict(list)
for r in range(R):
    for B, T in cases:
        for w in (list(sess) if r % 2 else list(sess)[::-1]):
            t[B, T, w].append(fused_call(sess[w], cache[w], (300 if T == 1 else 0) + 7 * np.arange(B), T, V)[0])
for B, T in cases:
    o, u = (statistics.median(t[B, T, w]) * 1e3 for w in sess)
    print(f"({B},{T}): {other} {o:.2f} ms, specexport {u:.2f} ms, {o / u:.2f}x")
if against:  # the same inputs and caches on both sides: the same logits, bit for bit, where only speed changed
    outs = {w: fused_call(s, cache[w], n4, 1, V)[1] for w, s in sess.items()}
    diff = float(np.abs(outs[other] - outs["specexport"]).max())
    print(f"(4, 1) logits, specexport against {other}: max |diff| {diff:.3g}")
