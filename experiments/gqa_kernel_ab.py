"""specexport's GroupQueryAttention kernel (specexport/kernels/gqa.c) against onnxruntime's own: one fused
target graph loaded twice, once with the kernel library registered, calls interleaved (order swapped each
round), same inputs, rows' caches of random numbers, past and present bound to one buffer per copy.
    python experiments/gqa_kernel_ab.py BUNDLE [ROUNDS] [--against REV]
--against REV: the other copy runs the kernels of git revision REV (its sources compiled with the same flags)
instead of onnxruntime's, to compare two versions of ours. The attention kernel alone: both copies run
onnxruntime's MatMul (SPECEXPORT_MATMUL=0 unless set; experiments/matmul_ab.py compares the MatMuls).
Calls: decode (1, 1) at 300 cached tokens, (8, 1) at 300-349, (16, 1) at 300-375, a 9-token verify (1, 9), a
64-token prefill chunk at n = 0, a 256-token chunk at n = 1,024; and what only the kernel takes: (8, 5), 8 rows
verifying 5 tokens each at 300-349, against onnxruntime's way, 8 calls (1, 5)."""
import collections, json, statistics, sys
from pathlib import Path
import os
import numpy as np, onnxruntime as ort
from specexport import kernels
from fused_calls import fused_call, rev_library  # experiments/
from specexport.backends.ort import session_options

os.environ.setdefault("SPECEXPORT_MATMUL", "0")  # read when a session registers the library

args = sys.argv[1:]
rev = args.pop(args.index("--against") + 1) if "--against" in args else None
args = [a for a in args if a != "--against"]
root = Path(args[0])
ROUNDS = int(args[1]) if len(args) > 1 else 10
arch = json.loads((root / "manifest.json").read_text())["models"]["target"]["arch"]
L, Hkv, D, V, S = arch["num_layers"], arch["num_kv_heads"], arch["head_dim"], arch["vocab_size"], 2048
lib = kernels.library(D)
assert lib, "the kernel library did not build"
other, them = None, rev or "onnxruntime"
if rev:  # REV's kernel sources, compiled as kernels.build does
    other = rev_library(rev)
sessions = {w: ort.InferenceSession(str(root / "target.onnx"), session_options(2, k), providers=["CPUExecutionProvider"])
            for w, k in (("ours", lib), ("ort", other))}
base = np.random.default_rng(0).standard_normal((L, 2, 16, Hkv, S, D), dtype=np.float32) * 0.5
caches = {w: base.copy() for w in sessions}


def call(who, n, T, rows=None):
    return fused_call(sessions[who], caches[who], n, T, V, rows)


def rows_apart(who, n, T):  # onnxruntime's way for several tokens per row: one call per row
    out = [call(who, n[b:b + 1], T, slice(b, b + 1)) for b in range(len(n))]
    return sum(t for t, _ in out), np.concatenate([lg for _, lg in out])


cases = {"(1,1) n=300": (np.array([300]), 1), "(8,1) n=300..349": (300 + 7 * np.arange(8), 1),
         "(16,1) n=300..375": (300 + 5 * np.arange(16), 1), "(1,9) n=300": (np.array([300]), 9),
         "(1,64) n=0": (np.array([0]), 64), "(1,256) n=1024": (np.array([1024]), 256)}
print(f"{root}: L={L} Hkv={Hkv} D={D}; kernel {lib}")
for name, (n, T) in cases.items():
    a, b = call("ours", n, T)[1], call("ort", n, T)[1]
    print(f"{name}: max |logit diff| {np.abs(a - b).max():.2e}, argmax same {(a.argmax(-1) == b.argmax(-1)).mean():.2f}")
n8 = 300 + 7 * np.arange(8)
a, b = call("ours", n8, 5)[1], (call("ort", n8, 5) if rev else rows_apart("ort", n8, 5))[1]
print(f"(8,5) against 8 x (1,5): max |logit diff| {np.abs(a - b).max():.2e}, argmax same {(a.argmax(-1) == b.argmax(-1)).mean():.2f}")
times = collections.defaultdict(list)
for r in range(ROUNDS):
    for name, (n, T) in cases.items():
        for who in (("ours", "ort") if r % 2 else ("ort", "ours")):
            times[name, who].append(call(who, n, T)[0])
    for who in (("ours", "ort") if r % 2 else ("ort", "ours")):
        times["(8,5) n=300..349", who].append(call(who, n8, 5)[0] if who == "ours" or rev else rows_apart("ort", n8, 5)[0])
for name in list(cases) + ["(8,5) n=300..349"]:
    o, t = (statistics.median(times[name, w]) * 1e3 for w in ("ours", "ort"))
    print(f"{name}: {them} {t:.2f} ms, ours {o:.2f} ms, {them}/ours {t / o:.3f}x"
          + (f" ({them}: 8 calls of (1,5))" if name.startswith("(8,5)") and not rev else ""))
