"""TensorRT backend: the bundle's engine (exporter/tensorrt.py), one execution context per profile T, tensor
addresses bound to a device-resident KV ring buffer (TorchRingKV) and static input/output buffers, and
execute_async_v3 (enqueueV3) per step; with cuda_graphs each (T, S, cache buffer) is captured once in a
torch.cuda.CUDAGraph and replayed.

Written against the TensorRT 10 Python API; it has not run yet (no machine this project was lent carries
TensorRT; docs/gpu.md). tests/test_torch_backend.py holds its GPU test, skipped without TensorRT and a GPU.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from ..bundle import BundleError, ModelEntry
from .base import BackendBase, StepOut
from .torch_graphs import DeviceSteps, TorchRingKV, fill_inputs, host_logits

def environment() -> dict:
    """{"tensorrt", "gpu", "compute_capability"} of this machine, or a clear error saying what is missing."""
    try:
        import tensorrt as trt
    except ImportError:
        raise RuntimeError("--engine tensorrt needs the tensorrt Python package (TensorRT 10) and an NVIDIA GPU: "
                           "pip install tensorrt on a GPU machine, or build without --engine") from None
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError
        p = torch.cuda.get_device_properties(0)
    except Exception:
        raise RuntimeError("--engine tensorrt needs an NVIDIA GPU and none is visible here (torch.cuda): build "
                           "engines on the machine that will run them") from None
    return {"tensorrt": trt.__version__, "gpu": p.name, "compute_capability": f"{p.major}.{p.minor}"}


def mismatch(record: dict, env: dict) -> str | None:
    """Why an engine cannot run here, or None."""
    for key in ("tensorrt", "gpu", "compute_capability"):
        if record.get(key) != env.get(key):
            return (f"the bundle's TensorRT engine {record.get('file')} was built for {key} {record.get(key)!r}, "
                    f"this machine has {env.get(key)!r}: rebuild the engines here (specexport build --engine "
                    "tensorrt) or use the onnxruntime backend")
    return None


_TORCH = {"int64": torch.int64, "bool": torch.bool, "float32": torch.float32}


class TrtBackend(DeviceSteps):
    def __init__(self, root: Path, entry: ModelEntry, buckets: list, device: str = "cuda", cuda_graphs: bool = True):
        import tensorrt as trt

        rec = entry.engine
        if not rec:
            raise BundleError(f"the bundle's {entry.role} has no TensorRT engine: rebuild with --engine tensorrt")
        why = mismatch(rec, environment())
        if why:
            raise BundleError(why)
        BackendBase.__init__(self, entry, buckets)
        self.device = torch.device(device)
        a = entry.arch
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
            (Path(root) / rec["file"]).read_bytes())
        self.stream = torch.cuda.Stream(self.device)
        self.contexts = {}
        for T, idx in rec["profile_of_T"].items():
            ctx = self.engine.create_execution_context()
            ctx.set_optimization_profile_async(idx, self.stream.cuda_stream)
            self.contexts[int(T)] = ctx
        self.cuda_graphs = cuda_graphs

    def _buffers(self, cache, T):
        b, new = self._static(cache, T)
        if new:
            ctx = self.contexts[T]
            for name, t in b.items():
                if name not in ("logits", "new_kv"):
                    ctx.set_input_shape(name, tuple(t.shape))
                ctx.set_tensor_address(name, t.data_ptr())
            for name, t in zip(self.kv_names, cache.views()):
                ctx.set_input_shape(name, tuple(t.shape))
                ctx.set_tensor_address(name, t.data_ptr())
            b["graph"] = None
        return b

    def _run(self, b, T):
        ctx = self.contexts[T]
        if not self.cuda_graphs:
            ctx.execute_async_v3(self.stream.cuda_stream)
            return
        if b["graph"] is None:  # one plain run first (TensorRT allocates lazily), then capture
            ctx.execute_async_v3(self.stream.cuda_stream)
            self.stream.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.stream):
                ctx.execute_async_v3(self.stream.cuda_stream)
            b["graph"] = g
        b["graph"].replay()

    def step(self, cache: TorchRingKV, ids, start: int, new_mask=None, positions=None, rows=None) -> StepOut:
        T = len(ids)
        self.check_profile(T)
        cache.reserve(start + T)
        b = self._buffers(cache, T)
        t = time.perf_counter()
        with torch.cuda.stream(self.stream):
            fill_inputs(b, cache, ids, start, new_mask, positions)
            self._run(b, T)
            logits = host_logits(b["logits"][0], rows)  # synchronises
            new_kv = b["new_kv"].clone()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)  # the commit reads new_kv
        return StepOut(logits, new_kv, time.perf_counter() - t)
