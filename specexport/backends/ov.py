"""The OpenVINO backend (CPU): a bundle's standard-op graph on OpenVINO's CPU plugin, float32 or bfloat16.

OpenVINO reads the bundle's ONNX graph itself (`--attention slots` or `portable`; the fused graph's
GroupQueryAttention is onnxruntime's own) and compiles it for the CPU it runs on: AVX-512 and AMX kernels where
they exist, and with precision "bf16" every MatMul in bfloat16 (weights converted once at load, activations per
call, float32 accumulation), half the bytes a decode step reads. The cache stays a float32 RingKV / KVPool that
the caller owns, passed by reference (no copy) as the graph's past inputs, exactly as for onnxruntime's portable
graph, so rollback and the engine work unchanged.

Losslessness: a bfloat16 model is its own target (plain decoding on this backend is the reference, as for the
int4 modes). Speculation is lossless only if a verify call scores tokens as decode calls do: at load the
backend measures that (`verify_drift`, the build's check) and, beyond the bundle's parity tolerance, marks the
target plain-only (`entry.speculative` False), so drafters are refused with the number. On a slots graph a
bfloat16 chain scores exactly as decoding (drift 0); a tree does not always, so bfloat16 drafts are chains.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np

from ..bundle import BundleError, ModelEntry
from ..errors import OptionError
from ..runtime.kv import KVPool, RingKV
from .base import BackendBase, StepOut, batch_inputs, logit_rows, step_inputs

PRECISIONS = {"openvino": "f32", "openvino-bf16": "bf16"}


class OvBackend(BackendBase):
    """One model of a slots or portable bundle on OpenVINO's CPU plugin; `precision` "f32" or "bf16"."""

    def __init__(self, root: Path, entry: ModelEntry, buckets: list, threads: int | None = None,
                 precision: str = "f32", batch_sizes: list | None = None):
        try:
            import openvino as ov
        except ImportError:
            raise OptionError("backend openvino needs OpenVINO: pip install 'specexport[openvino]'") from None
        super().__init__(entry, buckets, batch_sizes)
        if entry.attention == "fused":
            raise BundleError(f"backend openvino runs bundles built with --attention slots or portable (standard "
                              f"ONNX ops); this {entry.role} graph uses onnxruntime's fused attention: rebuild "
                              "with --attention slots (bfloat16 verify rows then score as decode rows), or use "
                              "backend='onnxruntime'")
        threads = threads or int(os.environ.get("SPECEXPORT_THREADS", 0)) or (os.cpu_count() or 1)
        props = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": str(threads),
                 "PERFORMANCE_HINT": "LATENCY"}
        try:
            self.compiled = ov.Core().compile_model(str(root / entry.graph), "CPU", props)
        except RuntimeError as e:  # OpenVINO's refusals of a graph are plain RuntimeErrors
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            raise BundleError(f"{entry.graph} (models.{entry.role}.graph) cannot be loaded by OpenVINO ({first}): "
                              "rebuild the bundle") from None
        got = ({n for x in self.compiled.inputs for n in x.get_names()},
               {n for x in self.compiled.outputs for n in x.get_names()})
        want = ({i["name"] for i in entry.inputs}, {o["name"] for o in entry.outputs})
        if not (want[0] <= got[0] and want[1] <= got[1]):
            raise BundleError(f"{entry.graph} (models.{entry.role}.graph) lacks inputs/outputs its manifest entry "
                              f"declares ({sorted((want[0] - got[0]) | (want[1] - got[1]))[:4]}): rebuild the bundle")
        self.row_input = "logit_rows" in want[0]  # a slots graph computes the LM head of the rows asked for only
        self.numerics = f"{'bfloat16' if precision == 'bf16' else 'float32'} math (OpenVINO)"
        self.plain_only_fix = ("rebuild with --attention slots, or " if entry.attention == "portable" else "") + \
            "load it with backend='openvino' (float32)"
        # bfloat16 rounds each partial sum: a tree node's attention over its ancestors in the call's slots
        # (not contiguous, as they are once committed) can differ from its decode call even on a slots graph
        # (measured: recycle on SmolLM2 differed on 1 of 13 Spec-Bench answers, prompt lookup on none), so
        # drafts are chains only
        self.exact_trees = precision != "bf16"
        if entry.role == "target" and entry.verify_ks():
            from ..runtime.prefill import verify_drift

            drift = verify_drift(self)
            ok = drift <= (entry.parity_tolerance or 1e-3)
            self.entry = dataclasses.replace(entry, verify_drift=drift, speculative=entry.speculative and ok)

    def _request(self, scratch: dict, key, data, views):
        """An infer request with `views` (a cache's layer buffers) set as the past inputs, kept in the cache's
        `scratch` until its buffer changes (a bucket growth): one per generation, one per (B, first) for the
        engine's pool. Setting 2L shared tensors costs ~2 ms, as much as a tenth of a decode call."""
        import openvino as ov

        held, req = scratch.get(key, (None, None))
        if held is not data:  # holding the old buffer keeps its address from being reused before this check
            req = req or self.compiled.create_infer_request()
            for name, view in zip(self.kv_names, views):
                req.set_tensor(name, ov.Tensor(view, shared_memory=True))
            scratch[key] = (data, req)
        return req

    def _run(self, req, feeds: dict) -> tuple[np.ndarray, np.ndarray, float]:
        import openvino as ov

        for name, a in feeds.items():
            req.set_tensor(name, ov.Tensor(np.ascontiguousarray(a), shared_memory=True))
        t = time.perf_counter()
        req.infer()
        run_s = time.perf_counter() - t
        # the request's output buffers are reused by its next call: keep copies
        return req.get_tensor("logits").data.copy(), req.get_tensor("new_kv").data.copy(), run_s

    def step(self, cache: RingKV, ids, start: int, new_mask: np.ndarray | None = None,
             positions: np.ndarray | None = None, rows: list | None = None) -> StepOut:
        """As OrtBackend.step on a portable graph: T = len(ids) new tokens against `cache`, nothing committed."""
        self.check_profile(len(ids))
        cache.reserve(start + len(ids))
        req = self._request(cache.scratch, ("ov", id(self)), cache.data, cache.views())
        feeds = step_inputs(cache, ids, start, new_mask, positions)
        if self.row_input:  # a slots graph: the LM head of the rows asked for only
            feeds["logit_rows"] = logit_rows(len(ids), rows)
        logits, new_kv, run_s = self._run(req, feeds)
        out = StepOut(logits[0], new_kv, run_s)
        return out if self.row_input else out.only(rows)

    def batch_ts(self, B: int) -> list[int]:
        return sorted(self.profile_ts)  # the portable graph runs any (B, T) it was built for

    def step_batch(self, pool: KVPool, ids: np.ndarray, positions: np.ndarray,
                   new_mask: np.ndarray | None = None, first: int = 0, rows=None) -> StepOut:
        """As OrtBackend.step_batch on a portable graph: pool rows [first, first+B), nothing committed."""
        B, T = self.batch_call(pool, ids, first)
        feeds = batch_inputs(pool, ids, positions, new_mask, first, rows, self.row_input)
        req = self._request(pool.scratch, ("ov", id(self), B, first), pool.data, pool.views(B, first))
        logits, new_kv, run_s = self._run(req, feeds)
        return StepOut(logits if rows is None or self.row_input else logits[:, logit_rows(T, rows)], new_kv, run_s)
