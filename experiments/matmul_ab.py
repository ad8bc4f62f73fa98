"""specexport's MatMul kernel (specexport/kernels/matmul.c) against onnxruntime's (MLAS): one fused target graph
loaded twice, both with the attention kernel, one with SPECEXPORT_MATMUL=0 (onnxruntime's MatMul), calls
interleaved (order swapped each round), same inputs, rows' caches of random numbers.
    python experiments/matmul_ab.py BUNDLE [ROUNDS] [mlas|bf16|bf16dot|amx|amxattn]
The third argument picks the other side: onnxruntime's MatMul (mlas, the default), or the same kernel with
bfloat16 weights (bf16; its logits differ from float32's by the weights' rounding) or with weights and
activations in bfloat16, multiplied in pairs by VDPBF16PS (bf16dot, where the CPU has avx512_bf16). amx: both
sides bf16dot, "ours" on VDPBF16PS (SPECEXPORT_AMX=0), the other on AMX tiles (where the CPU has amx_bf16).
amxattn: both sides bf16dot with the MatMuls on AMX, "ours" with the float32 attention
(SPECEXPORT_ATTENTION_AMX=0), the other with the attention's products on the tiles too (kernels/gqa_amx.h).
Calls: (B, T) = (1,1), (4,1), (8,1), (16,1), (1,9) verify, (8,5), (8,9), a 64-token chunk at n = 0 and a
256-token chunk at n = 1,024. Also checked: each row of an (8,1) call against the same row run alone, (1,1),
bit for bit (matmul.c's rows do not depend on what shares their call)."""
import collections, json, os, statistics, sys
from pathlib import Path
import numpy as np, onnxruntime as ort
from specexport import kernels
from fused_calls import fused_call  # experiments/
from specexport.backends.ort import session_options

root = Path(sys.argv[1])
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
OTHER = sys.argv[3] if len(sys.argv) > 3 else "mlas"
arch = json.loads((root / "manifest.json").read_text())["models"]["target"]["arch"]
L, Hkv, D, V, S = arch["num_layers"], arch["num_kv_heads"], arch["head_dim"], arch["vocab_size"], 2048
lib = kernels.library(D)
assert lib, "the kernel library did not build"
sessions = {}
for who in ("ours", OTHER):
    os.environ["SPECEXPORT_MATMUL"] = "0" if who == "mlas" else "1"  # read when the library is registered
    os.environ["SPECEXPORT_AMX"] = "1" if who in ("amx", "amxattn") or OTHER == "amxattn" else "0"  # per kernel
    os.environ["SPECEXPORT_ATTENTION_AMX"] = "1" if who == "amxattn" else "0"  # read when a session registers
    weights = "bf16dot" if OTHER in ("amx", "amxattn") else who if who.startswith("bf16") else "float32"
    sessions[who] = ort.InferenceSession(str(root / "target.onnx"), session_options(2, lib, weights),
                                         providers=["CPUExecutionProvider"])
os.environ.pop("SPECEXPORT_MATMUL"), os.environ.pop("SPECEXPORT_AMX"), os.environ.pop("SPECEXPORT_ATTENTION_AMX")
base = np.random.default_rng(0).standard_normal((L, 2, 16, Hkv, S, D), dtype=np.float32) * 0.5
caches = {w: base.copy() for w in sessions}


def call(who, n, T, rows=None):
    return fused_call(sessions[who], caches[who], n, T, V, rows)


n8 = 300 + 7 * np.arange(8)
cases = {"(1,1) n=300": (np.array([300]), 1), "(4,1) n=300..321": (n8[:4], 1), "(8,1) n=300..349": (n8, 1),
         "(16,1) n=300..375": (300 + 5 * np.arange(16), 1), "(1,9) n=300": (np.array([300]), 9),
         "(8,5) n=300..349": (n8, 5), "(8,9) n=300..349": (n8, 9), "(1,64) n=0": (np.array([0]), 64),
         "(1,256) n=1024": (np.array([1024]), 256)}
print(f"{root}: L={L}; kernel {lib}")
for name, (n, T) in cases.items():
    a, b = call("ours", n, T)[1], call(OTHER, n, T)[1]
    print(f"{name}: max |logit diff| ours-{OTHER} {np.abs(a - b).max():.2e}, argmax same {(a.argmax(-1) == b.argmax(-1)).mean():.2f}")
for who in sessions:  # row 3 of an (8,1) call against that row alone (its cache rows 3..3)
    batch = call(who, n8, 1)[1][3]
    alone = call(who, n8[3:4], 1, slice(3, 4))[1][0]
    print(f"{who}: row 3 of (8,1) against (1,1) alone: max |diff| {np.abs(batch - alone).max():.2e}"
          f" ({'bit-identical' if np.array_equal(batch, alone) else 'differs'})")
times = collections.defaultdict(list)
for r in range(ROUNDS):
    for name, (n, T) in cases.items():
        for who in (("ours", OTHER) if r % 2 else (OTHER, "ours")):
            times[name, who].append(call(who, n, T)[0])
for name in cases:
    o, m = (statistics.median(times[name, w]) * 1e3 for w in ("ours", OTHER))
    print(f"{name}: {OTHER} {m:.2f} ms, ours {o:.2f} ms, {OTHER}/ours {m / o:.3f}x")
