"""torch -> ONNX for one model, and weight-only quantisation of an exported graph.

One ONNX file per model with a symbolic B (sequences per call), T (new tokens per step) and S (cache slots),
everything else static (L, Hkv, D, V). The build's batch sizes and profiles are the B and T values it checks
and records, its capacity buckets the S values; the runtime runs only those. Buckets let a short context attend over 256 slots
instead of the full capacity (at S=2048 reading the whole cache costs SmolLM2 ~8 ms per step here).
One graph per model is what lets every profile share ONE copy of the weights, on disk (one external-data
file) and in memory (one onnxruntime session, one set of prepacked weights) -- and it maps directly onto
TensorRT, where static profiles are optimisation profiles of a single engine.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..graphs.config import GraphConfig
from ..graphs.llama import TOPK, FusedStep, LlamaGraph, MixedStep, SlotsStep, empty_inputs


def io_spec(c: GraphConfig, B: int | str = "B", attention: str = "portable") -> tuple[list, list]:
    """Input and output names, shapes and dtypes ("B": sequences of a batch size, "T": new tokens of a
    profile, "S": a capacity bucket, "L": cached + new tokens): input_ids, position_ids, the attention kind's
    mask inputs, past_key/value.i."""
    S = "S"
    kv = [B, c.num_kv_heads, S, c.head_dim]
    layers = [(i, n) for i in range(c.num_layers) for n in ("key", "value")]
    step = ([{"name": "past_mask", "shape": [B, S], "dtype": "bool"},
             {"name": "new_mask", "shape": [B, "T", "T"], "dtype": "bool"}]
            + ([{"name": "logit_rows", "shape": ["R"], "dtype": "int64"}] if attention == "slots" else [])
            if attention != "fused" else
            [{"name": "attn_bias", "shape": [B, 1, "T", "L"], "dtype": "float32"},
             {"name": "seqlens_k", "shape": [B], "dtype": "int32"},
             {"name": "total_len", "shape": [], "dtype": "int32"},
             {"name": "logit_rows", "shape": ["R"], "dtype": "int64"}])
    inputs = [
        {"name": "input_ids", "shape": [B, "T"], "dtype": "int64"},
        {"name": "position_ids", "shape": [B, "T"], "dtype": "int64"},
    ] + step + [{"name": f"past_{n}.{i}", "shape": kv, "dtype": "float32"} for i, n in layers]
    rows = "T" if attention == "portable" else "R"
    logits = {"name": "logits", "shape": [B, rows, c.vocab_size], "dtype": "float32"}
    if attention != "fused":
        return inputs, [logits, {"name": "new_kv", "shape": [c.num_layers, 2, B, c.num_kv_heads, "T", c.head_dim],
                                 "dtype": "float32"}]
    # fused: the new tokens' K/V are written into the cache in place (present = past), so no new_kv
    return inputs, [logits, {"name": "top_ids", "shape": [B, rows, TOPK], "dtype": "int64"}] + [
        {"name": f"present_{n}.{i}", "shape": kv, "dtype": "float32"} for i, n in layers]


def export(graph: LlamaGraph, S: int, path: Path, attention: str = "portable") -> None:
    """Write `path` (graph) and `path`.data (weights) for a step graph with symbolic T and S <= capacity S."""
    c = graph.c
    inputs, outputs = io_spec(c, attention=attention)
    B = torch.export.Dim("B", min=1, max=256)  # traced with B=2 so that B=1 is not specialised
    T = torch.export.Dim("T", min=1, max=S)
    Sd = torch.export.Dim("S", min=2, max=max(S, 4))
    kv = [{0: B, 2: Sd}] * (2 * c.num_layers)
    if attention == "portable":
        model, args = graph, empty_inputs(c, 2, S, B=2)
        dynamic = {"input_ids": {0: B, 1: T}, "position_ids": {0: B, 1: T}, "past_mask": {0: B, 1: Sd},
                   "new_mask": {0: B, 1: T, 2: T}, "past_kv": kv}
    elif attention == "slots":
        graph.slots = True
        ids, pos, past_mask, new_mask, past = empty_inputs(c, 2, S, B=2)
        model, args = SlotsStep(graph), (ids, pos, past_mask, new_mask, torch.tensor([1]), past)  # R != T
        dynamic = {"input_ids": {0: B, 1: T}, "position_ids": {0: B, 1: T}, "past_mask": {0: B, 1: Sd},
                   "new_mask": {0: B, 1: T, 2: T}, "logit_rows": {0: torch.export.Dim("R", min=1, max=S)},
                   "past_kv": kv}
    else:
        ids, pos, _, _, past = empty_inputs(c, 3, S, B=2)
        bias = torch.zeros(2, 1, 3, 6)  # 3 cached + 3 new tokens, logits for 2 of them (R != T when tracing)
        model, args = FusedStep(graph, S), (ids, pos, bias, torch.tensor([5, 5], dtype=torch.int32),
                                         torch.tensor(6, dtype=torch.int32), torch.tensor([0, 2]), past)
        dynamic = {"input_ids": {0: B, 1: T}, "position_ids": {0: B, 1: T},
                   "attn_bias": {0: B, 2: T, 3: torch.export.Dim("L", min=2, max=max(S, 6))},
                   "seqlens_k": {0: B}, "total_len": None, "logit_rows": {0: torch.export.Dim("R", min=1, max=S)},
                   "past_kv": kv}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=True, external_data=True,
                          input_names=[i["name"] for i in inputs], output_names=[o["name"] for o in outputs],
                          dynamic_shapes=dynamic, verbose=False)
    produced = Path(str(path) + ".data")
    if not produced.exists():  # tiny models: the exporter may inline everything; keep the layout uniform
        import onnx
        m = onnx.load(str(path))
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=produced.name, size_threshold=1024)
    if attention == "fused":  # the graphs specexport's CPU kernels run (portable ones stay plain ONNX)
        fuse_file(path)


def export_mixed(graph: LlamaGraph, S: int, path: Path, groups: int) -> None:
    """Write `path` (+ .data) for the mixed graph: the fused step of a batch plus `groups` batch-1 groups."""
    from ..backends.ort import mixed_names

    c = graph.c
    inputs, _ = io_spec(c, attention="fused")
    ins, outs = mixed_names([i["name"] for i in inputs if i["name"].startswith("past_")], groups)

    def call(B, T, n, R, tag):  # example inputs of one batch or group, and their symbolic dims
        ids, pos, _, _, past = empty_inputs(c, T, S, B=B)
        d = {n_: torch.export.Dim(n_ + tag, min=lo, max=hi) for n_, lo, hi in
             (("T", 1, S), ("S", 2, max(S, 4)), ("L", 2, max(S, 8)), ("R", 0, S))}
        args = (ids, pos, torch.zeros(B, 1, T, n + T), torch.full((B,), n + T - 1, dtype=torch.int32),
                torch.tensor(n + T, dtype=torch.int32), torch.arange(R), past)
        Bd = torch.export.Dim("B", min=1, max=256) if B > 1 else None
        dims = ({0: Bd, 1: d["T"]} if Bd else {1: d["T"]},) * 2 + (
            {0: Bd, 2: d["T"], 3: d["L"]} if Bd else {2: d["T"], 3: d["L"]}, {0: Bd} if Bd else None, None,
            {0: d["R"]}, [{0: Bd, 2: d["S"]} if Bd else {2: d["S"]}] * (2 * c.num_layers))
        return args, dims

    batch, dyn = call(2, 3, 3, 2, "")
    gs = [call(1, 3 + j, 2 + j, 2, f"{j}") for j in range(1, groups + 1)]  # distinct sizes: nothing unified
    args = (*batch, [a for a, _ in gs])
    dynamic = (*dyn, [d for _, d in gs])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(MixedStep(graph, groups, S), args, str(path), dynamo=True, external_data=True,
                          input_names=ins, output_names=outs, dynamic_shapes=dynamic, verbose=False)
    fuse_file(path)


def fuse_file(path: Path) -> None:
    """fuse_swiglu on a saved graph (its weights stay where they are)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    if fuse_swiglu(m):
        onnx.save_model(m, str(path))


def share_weights(graph: Path, into: Path) -> None:
    """Point `graph`'s external initializers at the identical tensors of `into`'s graph (same dtype, dims and
    bytes) in `into`'s weights file, append the ones it lacks there, and remove `graph`'s own weights file:
    two graphs of one model, one copy of its weights on disk."""
    import hashlib

    import onnx

    def tensors(m, base: Path):
        for t in m.graph.initializer:
            ext = {e.key: e.value for e in t.external_data}
            if "location" in ext:
                yield t, base / ext["location"], int(ext.get("offset", 0)), int(ext["length"])

    def key(t, path, off, n, cache={}):
        f = cache.get(path) or cache.setdefault(path, open(path, "rb"))
        f.seek(off)
        data = f.read(n)
        return (t.data_type, tuple(t.dims), hashlib.sha256(data).digest()), data

    base = into.parent
    target = onnx.load(str(into), load_external_data=False)
    data_name = {e.key: e.value for t in target.graph.initializer for e in t.external_data}.get("location")
    if data_name is None:
        return
    have = {key(t, p, o, n)[0]: (o, n) for t, p, o, n in tensors(target, base)}
    m = onnx.load(str(graph), load_external_data=False)
    own = set()
    with open(base / data_name, "ab") as out:
        for t, p, o, n in tensors(m, graph.parent):
            own.add(p)
            k, data = key(t, p, o, n)
            if k not in have:  # a constant only this graph has: appended, 64-byte aligned
                pad = -out.tell() % 64
                out.write(b"\0" * pad)
                have[k] = (out.tell(), n)
                out.write(data)
            off, n = have[k]
            del t.external_data[:]
            for name, value in (("location", data_name), ("offset", str(off)), ("length", str(n))):
                t.external_data.add(key=name, value=value)
    onnx.save_model(m, str(graph))
    for p in own:
        if p != base / data_name:
            p.unlink()


def quantize(src: Path, dst: Path, bits: int, accuracy_level: int = 4) -> None:
    """Weight-only int4/int8 copy of an exported graph: MatMul weights -> MatMulNBits (block 32, symmetric).
    accuracy_level 4 computes with int8-quantised activations (fastest); 1 computes in float32.
    onnxruntime's own quantiser."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

    model = onnx.load(str(src), load_external_data=False)
    unfuse_swiglu(model)
    onnx.load_external_data_for_model(model, str(src.parent))
    fold_weight_transposes(model)
    # the rotary's rotate_half matrix (g.rot, a signed permutation) stays a float MatMul: exact, where int8
    # activations would round q and k before rotating them
    rot = [n.name for n in model.graph.node if n.op_type == "MatMul" and "g.rot" in n.input]
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=True,
                             accuracy_level=accuracy_level, nodes_to_exclude=rot)
    q.process()
    onnx.save_model(q.model.model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)


SWIGLU = "MatMulSwiGLU"  # domain "specexport": specexport/kernels/matmul.c, and the function below where that is not


def swiglu_function(opset: int = 20):
    """MatMulSwiGLU(x, w) = silu(x w[:, :F]) * x w[:, F:], w [K, 2F]: the graph's own definition of the op (an
    ONNX model-local function), which onnxruntime inlines where no kernel of that name is registered (no
    specexport kernels: SPECEXPORT_KERNELS=0, no compiler) and OpenVINO or TensorRT would read as plain ops."""
    from onnx import helper

    nodes = [helper.make_node("MatMul", ["x", "w"], ["gu"]),
             helper.make_node("Split", ["gu"], ["g", "u"], axis=-1, num_outputs=2),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["h"]),
             helper.make_node("Mul", ["h", "u"], ["y"])]
    return helper.make_function("specexport", SWIGLU, ["x", "w"], ["y"], nodes, [helper.make_opsetid("", opset)])


def fuse_swiglu(model) -> int:
    """Replace each MLP's MatMul(x, W) -> Slice [0:F] -> silu, Slice [F:2F] -> Mul (gate and up stacked in one
    W [K, 2F], as graphs/llama.py exports them) by one MatMulSwiGLU(x, W) node; returns how many. The kernel
    writes silu(gate) * up straight from the product: onnxruntime's Split, QuickGelu and Mul were ~3.5% of a
    float32 512-token prefill call and three launches a layer in every decode step."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 18 or any(f.domain == "specexport" for f in model.functions):  # Split's num_outputs; fused already
        return 0
    inits = {t.name: t for t in g.initializer}
    rank = {v.name: len(v.type.tensor_type.shape.dim) for v in g.value_info}
    outputs = {o.name for o in g.output}
    users: dict = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)

    def ints(name):
        t = inits.get(name)
        return None if t is None or t.external_data else [int(v) for v in numpy_helper.to_array(t).reshape(-1)]

    def only(name, op):
        u = users.get(name, [])
        return u[0] if len(u) == 1 and u[0].op_type == op else None

    drop, fused = set(), 0
    for mm in list(g.node):
        w = inits.get(mm.input[1]) if mm.op_type == "MatMul" and len(mm.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.dims[1] % 2 or w.data_type != TensorProto.FLOAT:
            continue
        last = [-1] + ([rank[mm.output[0]] - 1] if mm.output[0] in rank else [])  # the slices' axis: the columns
        F = w.dims[1] // 2
        slices = users.get(mm.output[0], [])
        if len(slices) != 2 or any(s.op_type != "Slice" or len(s.input) < 4 for s in slices):
            continue
        spans = {}
        for s in slices:
            st, en, ax = ints(s.input[1]), ints(s.input[2]), ints(s.input[3])
            steps = ints(s.input[4]) if len(s.input) > 4 else [1]
            if st and en and ax and ax[0] in last and len(ax) == 1 and steps == [1] and len(st) == 1:
                spans[(st[0], min(en[0], 2 * F))] = s
        gate, up = spans.get((0, F)), spans.get((F, 2 * F))
        if gate is None or up is None:
            continue
        gu = users.get(gate.output[0], [])  # the gate feeds the Sigmoid and the Mul of silu
        sig = next((n for n in gu if n.op_type == "Sigmoid"), None)
        silu = next((n for n in gu if n.op_type == "Mul"), None)
        if len(gu) != 2 or sig is None or silu is None or set(silu.input) != {gate.output[0], sig.output[0]}:
            continue
        out = only(silu.output[0], "Mul")
        if out is None or set(out.input) != {silu.output[0], up.output[0]} or len(users.get(up.output[0], [])) != 1:
            continue
        if len(users.get(sig.output[0], [])) != 1:
            continue
        inner = [mm.output[0], gate.output[0], up.output[0], sig.output[0], silu.output[0]]
        if outputs & set(inner):  # an intermediate the graph returns: it must stay
            continue
        node = helper.make_node(SWIGLU, [mm.input[0], mm.input[1]], [out.output[0]], name=mm.name + "_swiglu",
                                domain="specexport")
        g.node.insert(list(g.node).index(mm), node)
        drop.update(id(n) for n in (mm, gate, up, sig, silu, out))
        fused += 1
    if fused:
        kept = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(kept)
        used = {i for n in kept for i in n.input} | {o.name for o in g.output}
        unused = [t for t in g.initializer if t.name not in used and not t.external_data]  # the Slices' bounds
        for t in unused:
            g.initializer.remove(t)
        model.functions.append(swiglu_function(opset))
        model.opset_import.append(helper.make_opsetid("specexport", 1))
    return fused


def unfuse_swiglu(model) -> None:
    """MatMulSwiGLU nodes back to their definition (the quantiser takes plain MatMuls only). On a model loaded
    without its external data (a whole model past 2 GB is more than one protobuf message may hold)."""
    import onnx.inliner

    if any(f.domain == "specexport" for f in model.functions):
        model.CopyFrom(onnx.inliner.inline_local_functions(model))
    if any(n.op_type == SWIGLU for n in model.graph.node):
        raise RuntimeError("MatMulSwiGLU nodes left after inlining their function (the graph's opset and the "
                           "function's disagree?): the quantiser would leave their weights in float32")


def fold_weight_transposes(model) -> None:
    """Replace Transpose(2-D initializer) by a transposed initializer, so that MatMuls fed by it (the tied
    LM head: MatMul(x, Transpose(embed_tokens))) have a constant weight the quantiser can take."""
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    for node in list(g.node):
        w = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        if w is None or len(w.dims) != 2:
            continue
        g.initializer.append(numpy_helper.from_array(numpy_helper.to_array(w).T.copy(), node.output[0]))
        g.node.remove(node)
