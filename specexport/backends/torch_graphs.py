"""Torch backend: the graphs/ modules run eagerly in torch (CPU or CUDA), the KV ring buffer (one sequence) or
the engine's pool (many) kept on the device, and on CUDA each (rows B, profile T, bucket S) step captured once
in a torch.cuda.CUDAGraph and replayed.

Optional: imported only when asked for (`specexport.load(..., backend="torch")`); it lives outside runtime/
so the ONNX Runtime path never imports torch. Needs the model's float32 checkpoint (the manifest's source path, safetensors), so it
serves checkpoint and early-exit models, not the int4/int8 ones (those exist only as ONNX graphs).
The CUDA-graph path has not run on a GPU yet (docs/benchmarks.md says where each backend was verified).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from ..bundle import ModelEntry
from ..graphs.config import GraphConfig
from ..graphs.llama import build
from ..runtime.kv import KVPool, RingKV
from .base import BackendBase, StepOut, batch_inputs, step_inputs


class OnDevice:
    """A cache whose buffer is a torch tensor on `device` (set before the cache's __init__ allocates through
    _zeros): commit is an on-device indexed copy."""

    def _zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=self.torch_dtype, device=self.device)

    def _index(self, idx):
        return torch.as_tensor(np.asarray(idx), device=self.device)


class TorchRingKV(OnDevice, RingKV):
    def __init__(self, layers, kv_heads, buckets, head_dim, device, dtype=torch.float32):
        self.device, self.torch_dtype = device, dtype
        super().__init__(layers, kv_heads, buckets, head_dim)


class TorchKVPool(OnDevice, KVPool):
    """The engine's pool of rows on the device (the torch backend's batch calls)."""

    def __init__(self, layers, kv_heads, buckets, head_dim, rows, device, dtype=torch.float32):
        self.device, self.torch_dtype = device, dtype
        super().__init__(layers, kv_heads, buckets, head_dim, rows)


def static_buffers(dims: tuple, vocab: int, T: int, S: int, device) -> dict:
    """Fixed-address step inputs and outputs (IO binding, TensorRT tensor addresses, graph capture)."""
    L, Hkv, D = dims
    z = lambda *s, dt=torch.bool: torch.zeros(*s, dtype=dt, device=device)  # noqa: E731
    return {"input_ids": z(1, T, dt=torch.int64), "position_ids": z(1, T, dt=torch.int64),
            "past_mask": z(1, S), "new_mask": z(1, T, T),
            "logits": z(1, T, vocab, dt=torch.float32), "new_kv": z(L, 2, 1, Hkv, T, D, dt=torch.float32)}


class DeviceSteps(BackendBase):
    host_cache = False

    """What the device backends (onnxruntime-device, TensorRT) share: a TorchRingKV cache on their device, and
    one set of static step buffers per (backend, T, bucket, cache buffer), kept with the generation's cache.
    Subclasses set shape, vocab and device."""

    def new_cache(self) -> TorchRingKV:
        L, Hkv, D = self.dims
        return TorchRingKV(L, Hkv, self.buckets, D, device=self.device)

    def _static(self, cache, T) -> tuple[dict, bool]:
        """-> (buffers, whether they were just made: bind them then)."""
        key = (id(self), T, cache.S, cache.data.data_ptr())
        b = cache.scratch.get(key)
        if b is not None:
            return b, False
        b = cache.scratch[key] = static_buffers(self.dims, self.vocab, T, cache.S, self.device)
        return b, True


def fill_inputs(b: dict, cache, ids, start: int, new_mask=None, positions=None) -> None:
    """Copy one step's inputs (backends.base.step_inputs) into its static buffers."""
    for name, a in step_inputs(cache, ids, start, new_mask, positions).items():
        b[name].copy_(torch.as_tensor(a), non_blocking=True)


def host_logits(logits: torch.Tensor, rows=None) -> np.ndarray:
    """A step's [T,V] (or [B,T,V]) device logits -> float32 numpy, only rows `rows` of T if given: the one
    device-to-host copy of a step (a prefill chunk copies its last row, not T)."""
    return (logits if rows is None else logits[..., list(rows), :]).float().to("cpu", copy=True).numpy()


def load_state_dict(path: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"the torch backend needs the float32 checkpoint at {path} (safetensors); it is not there")
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


class TorchBackend(BackendBase):
    host_cache = False

    def __init__(self, root: Path, entry: ModelEntry, buckets: list, device: str = "cpu",
                 cuda_graphs: bool | None = None, dtype: torch.dtype = torch.float32, state_dict: dict | None = None,
                 graph: torch.nn.Module | None = None, batch_sizes: list | None = None):
        """dtype: float32 (bit-for-bit the bundle's ONNX graphs up to kernel rounding), or float16 / bfloat16
        weights, activations and cache (faster on a GPU; greedy output may then differ from float32's).
        state_dict: the checkpoint's tensors, if not read from the manifest's source path; graph: an already
        built graphs.llama module instead (scripts/gpu_check.py times random-weight models this way)."""
        if entry.kind not in ("checkpoint", "early-exit"):
            raise ValueError(f"the torch backend cannot run the {entry.kind} {entry.role} (ONNX-only); use the "
                             "onnxruntime backend, or a bundle whose draft is a checkpoint or self:layers=N")
        super().__init__(entry, buckets, batch_sizes)
        self.device = torch.device(device)
        c = GraphConfig.from_summary(entry.arch)
        if graph is None:
            graph = build(c, state_dict if state_dict is not None else load_state_dict(Path(entry.source.get("path"))))
        self.graph = graph.to(self.device, dtype)
        self.graph.inv_freq = torch.tensor(c.inv_freq, dtype=torch.float32, device=self.device)  # angles in fp32
        self.dtype = dtype
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self._graphs: dict = {}  # (B, T, S, cache buffer address) -> (graph, static inputs, static outputs)
        if dtype != torch.float32 and entry.role == "target" and entry.speculative and entry.verify_ks():
            # half-precision products round each partial sum, and a verify call's [T, E] products are tiled
            # differently from a decode call's [1, E]: on an H200 (2026-12-04) bf16 speculation gave other tokens
            # than bf16 plain decoding in 3 of 4 draft settings. Measure it as the build does (chain and tree);
            # beyond the tolerance the target loads plain-only and drafts are refused with the number.
            from ..runtime.prefill import measured_entry

            self.numerics = f"{str(dtype).split('.')[-1]} math (torch backend)"
            self.plain_only_fix = "load the torch backend with dtype=torch.float32"
            self.entry = measured_entry(self, trees=False)

    def new_cache(self) -> TorchRingKV:
        L, Hkv, D = self.dims
        return TorchRingKV(L, Hkv, self.buckets, D, device=self.device, dtype=self.dtype)

    def new_pool(self, rows: int) -> TorchKVPool:
        L, Hkv, D = self.dims
        return TorchKVPool(L, Hkv, self.buckets, D, rows, device=self.device, dtype=self.dtype)

    def _inputs(self, cache, ids, start, new_mask, positions):
        x = step_inputs(cache, ids, start, new_mask, positions)
        return (*(torch.as_tensor(a).to(self.device) for a in x.values()), cache.views())

    def step(self, cache: TorchRingKV, ids, start: int, new_mask=None, positions=None, rows=None) -> StepOut:
        T = len(ids)
        self.check_profile(T)
        cache.reserve(start + T)
        t = time.perf_counter()
        x = self._inputs(cache, ids, start, new_mask, positions)
        with torch.no_grad():
            logits, new_kv = self._run(cache, 1, T, x)
            out = host_logits(logits[0], rows)
        return StepOut(out, new_kv, time.perf_counter() - t)

    # ---- many sequences per call (the engine)
    def batch_ts(self, B: int) -> list[int]:
        return sorted(self.profile_ts)  # the graphs/ module takes per-row masks: any (B, T) it was built for

    def step_batch(self, pool: TorchKVPool, ids: np.ndarray, positions: np.ndarray,
                   new_mask: np.ndarray | None = None, first: int = 0, rows=None) -> StepOut:
        """As OrtBackend.step_batch on a portable graph: pool rows [first, first+B), nothing committed; logits
        [B,R,V] on the host, new_kv on the device (the pool commits from it there)."""
        B, T = self.batch_call(pool, ids, first)
        t = time.perf_counter()
        feeds = batch_inputs(pool, ids, positions, new_mask, first, None, False)
        x = (*(torch.as_tensor(a).to(self.device) for a in feeds.values()), pool.views(B, first))
        with torch.no_grad():
            logits, new_kv = self._run(pool, B, T, x)
            out = host_logits(logits, rows)
        return StepOut(out, new_kv, time.perf_counter() - t)

    def _run(self, cache, B: int, T: int, x):
        return self._replay(cache, B, T, x) if self.cuda_graphs else self.graph(*x)

    def _replay(self, cache, B, T, x):
        """On CUDA: the step of this (B, T) and cache buffer captured once in a CUDA graph, then replayed with
        the new inputs copied into its static ones (x[4]: the cache's layer views, fixed per buffer)."""
        key = (B, T, cache.S, x[4][0].data_ptr())
        if key not in self._graphs:
            static = [a.clone() for a in x[:4]]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm up outside the capture, as torch.cuda.graphs asks
                self.graph(*static, x[4])
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = self.graph(*static, x[4])
            self._graphs[key] = (g, static, outs)
        g, static, outs = self._graphs[key]
        for dst, src in zip(static, x[:4]):
            dst.copy_(src)
        g.replay()
        return outs[0], outs[1].clone()
