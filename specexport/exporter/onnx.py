"""torch -> ONNX for one model, and weight-only quantisation of an exported graph.

One ONNX file per model with a symbolic T (new tokens per step) and everything else static (B, S, L,
Hkv, D, V). The build's profiles are the T values it checks and records; the runtime runs only those.
One graph per model is what lets every profile share ONE copy of the weights, on disk (one external-data
file) and in memory (one onnxruntime session, one set of prepacked weights) -- and it maps directly onto
TensorRT, where static profiles are optimisation profiles of a single engine.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from ..graphs.config import GraphConfig
from ..graphs.llama import LlamaGraph, empty_inputs


def io_spec(c: GraphConfig, S: int, B: int = 1) -> tuple[list, list]:
    """Input and output names, shapes and dtypes ("T" marks the profile dimension)."""
    kv = [B, c.num_kv_heads, S, c.head_dim]
    inputs = [
        {"name": "input_ids", "shape": [B, "T"], "dtype": "int64"},
        {"name": "position_ids", "shape": [B, "T"], "dtype": "int64"},
        {"name": "past_mask", "shape": [B, S], "dtype": "bool"},
        {"name": "new_mask", "shape": [B, "T", "T"], "dtype": "bool"},
    ] + [{"name": f"past_{n}.{i}", "shape": kv, "dtype": "float32"}
         for i in range(c.num_layers) for n in ("key", "value")]
    outputs = [
        {"name": "logits", "shape": [B, "T", c.vocab_size], "dtype": "float32"},
        {"name": "new_kv", "shape": [c.num_layers, 2, B, c.num_kv_heads, "T", c.head_dim], "dtype": "float32"},
    ]
    return inputs, outputs


def export(graph: LlamaGraph, S: int, path: Path) -> None:
    """Write `path` (graph) and `path`.data (weights) for a symbolic-T step graph with capacity S."""
    c = graph.c
    inputs, outputs = io_spec(c, S)
    T = torch.export.Dim("T", min=1, max=S)
    dynamic = {"input_ids": {1: T}, "position_ids": {1: T}, "past_mask": None, "new_mask": {1: T, 2: T},
               "past_kv": [None] * (2 * c.num_layers)}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, empty_inputs(c, 2, S), str(path), dynamo=True, external_data=True,
                          input_names=[i["name"] for i in inputs], output_names=[o["name"] for o in outputs],
                          dynamic_shapes=dynamic, verbose=False)
    produced = Path(str(path) + ".data")
    if not produced.exists():  # tiny models: the exporter may inline everything; keep the layout uniform
        import onnx
        m = onnx.load(str(path))
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=produced.name, size_threshold=0)


def quantize(src: Path, dst: Path, bits: int) -> None:
    """Weight-only int4/int8 copy of an exported graph: MatMul weights -> MatMulNBits (block 32, symmetric);
    activations stay float32. onnxruntime's own quantiser."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(str(src)), bits=bits, block_size=32, is_symmetric=True, accuracy_level=4)
    q.process()
    onnx.save_model(q.model.model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
