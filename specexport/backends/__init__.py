"""Backends: what runs one model's step graph. `open_model` is the one place that names them all.

- ort (onnxruntime, CPU): the default; torch-free, like the runtime. onnxruntime-bf16: the same with the
  weights held in bfloat16 by specexport's MatMul kernel (float32 math); onnxruntime-bf16dot: the weight
  MatMuls' activations rounded to bfloat16 too, multiplied by VDPBF16PS (avx512_bf16) or AMX tiles (amx_bf16):
  targets of their own.
- ort_device (onnxruntime with IO binding into a device-resident cache: the CUDA EP path; needs torch),
  torch_graphs (graphs/ modules in torch, CUDA graphs on CUDA; needs torch and the float32 checkpoint),
  trt (the bundle's TensorRT engines; needs torch and TensorRT), ov (OpenVINO's CPU plugin, float32, bfloat16
  or int4 weights, slots and portable bundles; needs openvino): optional, imported only when asked for.
base.py holds what they share. Nothing here imports the exporter.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import OptionError

OPENVINO = ("openvino", "openvino-bf16", "openvino-int4")  # float32, bfloat16, int4 weights (ov.PRECISIONS)
ORT_WEIGHTS = {"onnxruntime": "float32", "onnxruntime-bf16": "bf16", "onnxruntime-bf16dot": "bf16dot"}
KINDS = (*ORT_WEIGHTS, "onnxruntime-device", "tensorrt", "torch") + OPENVINO


def open_model(kind: str, root: Path, entry, manifest, threads: int | None = None, device: str = "cpu"):
    """One model of a bundle on backend `kind`."""
    if kind in ORT_WEIGHTS:  # -bf16, -bf16dot: weights rounded to bfloat16 by the MatMul kernel
        from .ort import OrtBackend
        return OrtBackend(root, entry, manifest.buckets, threads, batch_sizes=manifest.batch_sizes,
                          weights=ORT_WEIGHTS[kind])
    if kind == "torch":
        from .torch_graphs import TorchBackend
        return TorchBackend(root, entry, manifest.buckets, device=device, batch_sizes=manifest.batch_sizes)
    if kind == "onnxruntime-device":
        from .ort_device import OrtDeviceBackend
        return OrtDeviceBackend(root, entry, manifest.buckets, device=device, threads=threads)
    if kind == "tensorrt":
        from .trt import TrtBackend
        return TrtBackend(root, entry, manifest.buckets, device=device if device != "cpu" else "cuda")
    if kind in OPENVINO:
        from .ov import PRECISIONS, OvBackend
        return OvBackend(root, entry, manifest.buckets, threads, precision=PRECISIONS[kind],
                         batch_sizes=manifest.batch_sizes)
    raise OptionError(f"backend must be one of {', '.join(KINDS)}, got {kind!r}")
