"""How often does a quantised copy of the target, as a self-draft, pick the target's greedy token? Teacher-forced
on the target's greedy output (the burst's first 16 Spec-Bench prompts, 128 new tokens): the draft's argmax after
every committed token (its own cache, prefilled with the prompt, fed the output in 64-token calls) against the
target's next token. The bundle's draft first, then each variant: the bundle's float32 target graph quantised
again in /tmp, its MatMulNBits run where the bundle's draft runs (specexport's kernel, int8 activations).

    python experiments/draft_agreement.py BUNDLE [VARIANT ...]

Variants: rtn4 (onnxruntime's quantiser, 4-bit, block 32, symmetric: what `--draft self:int4` builds), mse4 (the
same blocks, each block's scale the one of 33 candidates with the least squared error), gptq4 (GPTQ, block 32
symmetric, each MatMul's Hessian from its inputs on the 16 build-time seed prompts of exporter/seed.py and their
greedy answers, transformers' eager model), int8 (`--draft self:int8`), int8col (8-bit, one scale per column),
keep=REGEX (4-bit but the MatMuls whose node name matches REGEX kept float32; the unfused MLP MatMuls are named
mlp_up_<layer>, the LM head node_linear_120).
"""
import argparse
import logging
import re
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import specexport
from specexport.backends.ort import session_options
from specexport.exporter import onnx as sx
from teacher_forced import forced, greedy  # experiments/

ap = argparse.ArgumentParser()
ap.add_argument("bundle")
ap.add_argument("variants", nargs="*")
a = ap.parse_args()
B = Path(a.bundle)
pipe = specexport.load(str(B), threads=2)
d = pipe.draft
rows = greedy(pipe)


def agreement(model) -> float:
    hit = sum(int((forced(model, ids, n0).argmax(-1) == np.array(out)).sum()) for _, ids, n0, out in rows)
    return hit / sum(len(out) for *_, out in rows)


def float_graph():
    """The target graph as the quantiser sees it (MLP unfused, weight transposes folded), the unnamed MLP
    MatMuls named mlp_up_<layer>."""
    m = onnx.load(str(B / "target.onnx"), load_external_data=False)
    sx.unfuse_swiglu(m)
    onnx.load_external_data_for_model(m, str(B))
    sx.fold_weight_transposes(m)
    up = 0
    for n in m.graph.node:
        if n.op_type == "MatMul" and not n.name:
            n.name, up = f"mlp_up_{up}", up + 1
    return m


def weights(m) -> list:
    """[(MatMul output name, W [K, N])] of the weight MatMuls in graph order (the rotary's stays float)."""
    inits = {i.name: i for i in m.graph.initializer}
    return [(n.output[0], numpy_helper.to_array(inits[n.input[1]])) for n in m.graph.node
            if n.op_type == "MatMul" and n.input[1] in inits and "g.rot" not in n.input]


def quantise(m, bits: int, keep=()) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    rot = [n.name for n in m.graph.node if n.op_type == "MatMul" and "g.rot" in n.input]
    q = MatMulNBitsQuantizer(m, bits=bits, block_size=32, is_symmetric=True, accuracy_level=4,
                             nodes_to_exclude=rot + list(keep))
    q.process()
    return q.model.model


def blocks(W: np.ndarray, mode: str):
    """W [K, N] -> (4-bit q [N, K] in 0..15, scales [N, K / 32]): each block's value of largest magnitude v maps
    to -8 (scale v / -8, onnxruntime's rule), or with mse the candidate scale v / c (c in -8..-6 and 6..7.5 by
    0.125) of least squared error."""
    K, N = W.shape
    w = W.T.reshape(N, K // 32, 32).astype(np.float64)
    v = np.take_along_axis(w, np.abs(w).argmax(-1)[..., None], -1)[..., 0]
    cands = [-8.0] if mode == "rtn" else list(np.arange(-8, -5.99, 0.125)) + list(np.arange(6, 7.51, 0.125))
    best, bs, bq = np.full(v.shape, np.inf), np.zeros_like(v), np.zeros(w.shape)
    for c in cands:
        s = np.where(v == 0, 1.0, v / c)
        q = np.clip(np.rint(w / s[..., None]) + 8, 0, 15)
        err = (((q - 8) * s[..., None] - w) ** 2).sum(-1)
        better = err < best
        best, bs, bq = np.where(better, err, best), np.where(better, s, bs), np.where(better[..., None], q, bq)
    return bq.reshape(N, K).astype(np.uint8), bs.astype(np.float32)


def gptq(W: np.ndarray, H, group: int = 32, block: int = 128, damp: float = 0.01):
    """GPTQ (Frantar et al. 2022) of W [K, N] under the inputs' Hessian H [K, K] -> (q [N, K], scales): columns
    of k in order, each group's scale (onnxruntime's rule) from the weights as the earlier columns' errors left
    them."""
    import torch

    W = torch.from_numpy(W.T.astype(np.float64)).clone()
    N, K = W.shape
    H = H.clone()
    H += damp * torch.mean(torch.diag(H)) * torch.eye(K, dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q, S = torch.zeros(N, K, dtype=torch.uint8), torch.zeros(N, K // group, dtype=W.dtype)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1, E1, Hi = W[:, i1:i2].clone(), torch.zeros(N, i2 - i1, dtype=W.dtype), Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            c = i1 + i
            if c % group == 0:
                g = W1[:, i:i + group]
                v = g.gather(1, g.abs().argmax(1)[:, None])[:, 0]
                S[:, c // group] = torch.where(v == 0, torch.ones_like(v), v / -8)
            s = S[:, c // group]
            q = torch.clamp(torch.round(W1[:, i] / s) + 8, 0, 15)
            Q[:, c] = q.to(torch.uint8)
            E1[:, i] = err = (W1[:, i] - (q - 8) * s) / Hi[i, i]
            W1[:, i:] -= err[:, None] @ Hi[i, i:][None]
        W[:, i2:] -= E1 @ Hinv[i1:i2, i2:]
    return Q.numpy(), S.float().numpy()


def hessians():
    """Each weight MatMul's input second moment, in graph order (q/k/v share one, gate/up one), from
    transformers' model of the target on the seed prompts with their greedy answers."""
    import torch
    from transformers import AutoModelForCausalLM

    from specexport.exporter.seed import PROMPTS

    hf = AutoModelForCausalLM.from_pretrained(pipe.manifest.target.source["path"], dtype=torch.float32).eval()
    mods = [m for layer in hf.model.layers for m in (layer.self_attn.q_proj, layer.self_attn.o_proj,
                                                     layer.mlp.gate_proj, layer.mlp.down_proj)] + [hf.lm_head]
    H = [0] * len(mods)
    n = [0]

    def hook(i):
        def f(mod, inp):
            x = inp[0].detach().reshape(-1, inp[0].shape[-1]).double()
            H[i] = H[i] + x.T @ x
        return f
    for i, m in enumerate(mods):
        m.register_forward_pre_hook(hook(i))
    for p in PROMPTS:
        g = pipe.generate([{"role": "user", "content": p}], chat=True, max_new_tokens=128, draft="none")
        ids = torch.tensor([list(g.prompt_ids) + list(g.token_ids)])
        n[0] += ids.shape[1]
        with torch.no_grad():
            hf(ids)
    return [h / n[0] for h in H]


def variant(name: str) -> Path:
    out = Path(f"/tmp/draft_agreement/{name.replace('=', '-').replace('|', '_')[:80]}.onnx")
    out.parent.mkdir(exist_ok=True)
    m = float_graph()
    keep = [n.name for n in m.graph.node if n.op_type == "MatMul" and name.startswith("keep=")
            and re.fullmatch(name[5:], n.name)]
    ws = dict(weights(m))
    order = [o for o, _ in weights(m)]
    q = quantise(m, 8 if name.startswith("int8") else 4, keep)
    inits = {i.name: i for i in q.graph.initializer}
    nodes = {n.output[0]: n for n in q.graph.node if n.op_type == "MatMulNBits"}
    H = hessians() if name == "gptq4" else None
    for i, o in enumerate(order):
        if o not in nodes or name in ("rtn4", "int8") or name.startswith("keep="):
            continue
        W = ws[o]
        K, N = W.shape
        if name == "int8col":
            s = np.abs(W).max(0) / 127.0
            s = np.where(s == 0, 1.0, s).astype(np.float32)
            Bq = (np.clip(np.rint(W / s), -127, 127) + 128).T.astype(np.uint8)
            S = np.repeat(s[:, None], K // 32, 1)
        else:
            qq, S = gptq(W, H[i]) if name == "gptq4" else blocks(W, "mse")
            Bq = qq[:, 0::2] | (qq[:, 1::2] << 4)
        bi, si = inits[nodes[o].input[1]], inits[nodes[o].input[2]]
        bi.CopyFrom(numpy_helper.from_array(Bq.reshape(tuple(bi.dims)), bi.name))
        si.CopyFrom(numpy_helper.from_array(S.reshape(tuple(si.dims)).astype(np.float32), si.name))
    onnx.save_model(q, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    return out


print(f"{a.bundle}'s draft ({d.entry.kind}): {agreement(d):.4f}", flush=True)
for v in a.variants:
    t = time.perf_counter()
    d.session = ort.InferenceSession(str(variant(v)), session_options(None, d.kernel, "float32", d.nbits),
                                     providers=["CPUExecutionProvider"])
    print(f"{v}: {agreement(d):.4f} ({time.perf_counter() - t:.0f} s)", flush=True)
