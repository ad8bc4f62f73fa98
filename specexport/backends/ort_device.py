"""ONNX Runtime with IO binding and a device-resident KV ring buffer: the onnxruntime-gpu (CUDA EP) path.

The cache is a TorchRingKV on the device; each step binds its past_key/past_value views, small input
tensors and preallocated logits / new_kv outputs by device pointer (`IOBinding.bind_input/bind_output`), so
the cache never crosses to the host: commit is an on-device indexed copy of the accepted rows, and the one
device-to-host copy of a step is its logits. With `cuda_graphs`, the CUDA EP captures one graph per
(T, S, cache buffer) (`enable_cuda_graph` + the `gpu_graph_id` run option); inputs are copied into static
buffers first, as the capture requires fixed addresses.

Optional (imports torch for the device buffers); lives outside runtime/ for that reason. The same code runs
on the CPU EP with device="cpu", which is how it is tested here; the CUDA EP and its graph capture have not
run anywhere yet (no onnxruntime-gpu on the machines this project was lent; docs/gpu.md).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..bundle import BundleError, ModelEntry
from .base import BackendBase, StepOut
from .torch_graphs import DeviceSteps, TorchRingKV, fill_inputs, host_logits


class OrtDeviceBackend(DeviceSteps):
    def __init__(self, root: Path, entry: ModelEntry, buckets: list, device: str = "cuda",
                 cuda_graphs: bool = False, threads: int | None = None):
        import onnxruntime as ort

        if entry.attention != "portable":
            raise BundleError(f"the bundle's {entry.role} was built with --attention {entry.attention} "
                              "(onnxruntime's GroupQueryAttention, CPU runtime); the onnxruntime-device backend "
                              "binds a portable graph: rebuild with --attention portable")
        self.device = torch.device(device)
        kind = self.device.type
        want = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}[kind]
        if want not in ort.get_available_providers():
            raise RuntimeError(f"onnxruntime has no {want} here (available: {ort.get_available_providers()}): "
                               "install onnxruntime-gpu for CUDA, or use backend='torch'")
        BackendBase.__init__(self, entry, buckets)
        a = entry.arch
        self.cuda_graphs = cuda_graphs and kind == "cuda"
        from .ort import session_options

        so = session_options(threads)  # the process's one onnxruntime thread pool (backends/ort.py)
        opts = {"device_id": self.device.index or 0} if kind == "cuda" else {}
        if self.cuda_graphs:
            opts["enable_cuda_graph"] = "1"
        self.session = ort.InferenceSession(str(root / entry.graph), so, providers=[(want, opts)])
        self._ort = ort
        self._graphs = 0  # CUDA graphs captured so far: each static buffer set gets its own gpu_graph_id

    def _buffers(self, cache, T):
        b, new = self._static(cache, T)
        if new:
            io = self.session.io_binding()
            elem = {torch.int64: np.int64, torch.bool: np.bool_, torch.float32: np.float32}
            for name, t in b.items():
                bind = io.bind_output if name in ("logits", "new_kv") else io.bind_input
                bind(name, self.device.type, self.device.index or 0, elem[t.dtype], list(t.shape), t.data_ptr())
            for name, t in zip(self.kv_names, cache.views()):
                io.bind_input(name, self.device.type, self.device.index or 0, np.float32, list(t.shape), t.data_ptr())
            b["io"] = io
            self._graphs += 1
            b["graph_id"] = str(self._graphs)
        return b

    def step(self, cache: TorchRingKV, ids, start: int, new_mask=None, positions=None, rows=None) -> StepOut:
        T = len(ids)
        self.check_profile(T)
        cache.reserve(start + T)
        b = self._buffers(cache, T)  # after reserve: a grown cache is a new buffer with new bindings
        fill_inputs(b, cache, ids, start, new_mask, positions)
        ro = None
        if self.cuda_graphs:
            ro = self._ort.RunOptions()
            ro.add_run_config_entry("gpu_graph_id", b["graph_id"])
        t = time.perf_counter()
        self.session.run_with_iobinding(b["io"], ro)
        return StepOut(host_logits(b["logits"][0], rows), b["new_kv"].clone(), time.perf_counter() - t)
