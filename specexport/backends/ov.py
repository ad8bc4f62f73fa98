"""The OpenVINO backend (CPU): a bundle's standard-op graph on OpenVINO's CPU plugin, float32, bfloat16, or
float32 with int4 weights.

OpenVINO reads the bundle's ONNX graph itself (`--attention slots` or `portable`; the fused graph's
GroupQueryAttention is onnxruntime's own) and compiles it for the CPU it runs on: AVX-512 and AMX kernels where
they exist. Precision "bf16": every MatMul in bfloat16 (weights converted once at load, activations per call,
float32 accumulation), half the bytes a decode step reads. Precision "int4": the weights are quantised at load
(`compress_weights`: int4 projections, an int8 LM head), and the plugin runs those MatMuls on int8 kernels with
the activations quantised per row. The cache stays a float32 RingKV / KVPool that the caller owns, passed by
reference (no copy) as the graph's past inputs, exactly as for onnxruntime's portable graph, so rollback and
the engine work unchanged. A sequence's decode and verify calls run on models compiled with B = 1 and T fixed
(`fixed_shape`; the cache length stays dynamic): 1.2x faster decode calls on SmolLM2, for a copy of the
weights per T (`fixed_ts`, SPECEXPORT_OV_FIXED).

Losslessness: a bfloat16 or int4 model is its own target (plain decoding on this backend is the reference, as
for the int4 bundles). Speculation is lossless only if a verify call scores tokens as decode calls do: at load
the backend measures that (`prefill.measured_entry`, the build's check, a chain and a tree) and, beyond the
bundle's parity tolerance, marks the target plain-only (a chain drifts) or chain-only (a tree drifts). On a
slots graph bfloat16 and int4 chains score exactly as decoding (drift 0); trees do not, so their drafts are
chains.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from pathlib import Path

import numpy as np

from ..bundle import BundleError, ModelEntry
from ..errors import OptionError
from ..runtime.kv import KVPool, RingKV
from .base import BackendBase, StepOut, batch_inputs, logit_rows, step_inputs

PRECISIONS = {"openvino": "f32", "openvino-bf16": "bf16", "openvino-int4": "int4"}
# a prefill call's fixed cost in prompt tokens (runtime/prefill.py), per precision: a + b*T fitted to calls of
# T = 1..256 on SmolLM2 (experiments/call_cost_probe.py, `xeon-amx`, 2026-12-03); onnxruntime's is 15-16
CALL_COSTS = {"f32": 35, "bf16": 52, "int4": 30}
GROUP = 32  # int4 weights: one scale per 32 input channels, as OpenVINO GenAI's int4 models here (--group-size 32)


def compress_weights(model, head_dim: int, vocab: int, group: int = GROUP) -> int:
    """Quantise `model`'s weight MatMuls in place (an OpenVINO model read from a bundle's float32 graph):
    int4 symmetric with one float16 scale per `group` input channels for every projection, int8 with one
    scale per output channel for the LM head (NNCF keeps the last layer at 8 bits by default too). Written
    as the weight-decompression pattern the CPU plugin folds into its FullyConnected node, Constant(i4) ->
    Convert -> Multiply(scale) -> Reshape -> MatMul(transpose_b), which runs on int8 kernels (AMX / VNNI)
    with the activations quantised per row on the fly (DYNAMIC_QUANTIZATION_GROUP_SIZE). The rotary's
    [D,D] product stays float. Returns how many MatMuls it rewrote."""
    import openvino as ov
    from openvino import opset13 as ops

    done = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or op.get_attributes()["transpose_b"]:
            continue
        w = op.input_value(1).get_node()
        if w.get_type_name() == "Transpose" and w.input_value(0).get_node().get_type_name() == "Constant":
            wt = w.input_value(0).get_node().get_data()  # a tied LM head: the embedding [V, E], transposed
        elif w.get_type_name() == "Constant":
            wt = w.get_data().T
        else:
            continue
        if wt.ndim != 2 or wt.shape == (head_dim, head_dim):
            continue
        wt = np.ascontiguousarray(wt, dtype=np.float32)  # [N, K]: the layout transpose_b reads
        N, K = wt.shape
        if N == vocab or K % group:  # the LM head: int8, one scale per output channel
            s = (np.abs(wt).max(1, keepdims=True) / 127).astype(np.float16)
            s[s == 0] = 1
            q = np.clip(np.round(wt / s.astype(np.float32)), -127, 127).astype(np.int8)
            dq = ops.multiply(ops.convert(ops.constant(q, dtype=ov.Type.i8), ov.Type.f16), ops.constant(s))
        else:
            g = wt.reshape(N, K // group, group)
            s = (np.abs(g).max(2, keepdims=True) / 8).astype(np.float16)
            s[s == 0] = 1
            q = np.clip(np.round(g / s.astype(np.float32)), -8, 7).astype(np.int8)
            dq = ops.multiply(ops.convert(ops.constant(q, dtype=ov.Type.i4), ov.Type.f16), ops.constant(s))
            dq = ops.reshape(dq, ops.constant(np.array([N, K], dtype=np.int64)), False)
        new = ops.matmul(op.input_value(0), ops.convert(dq, ov.Type.f32), False, True)
        op.output(0).replace(new.output(0))
        done += 1
    return done


FIXED_MAX_BYTES = 2 ** 30  # "auto": fixed-shape models for graphs with at most 1 GiB of float32 weights


def fixed_ts(root: Path, entry: ModelEntry) -> list[int]:
    """The T of the calls a sequence makes once per token or step (decode, verify, a draft's catch-up), which
    get a compiled model of their own with B = 1 and T fixed (`fixed_shape`). SPECEXPORT_OV_FIXED: "auto"
    (the default) for a model of at most 1 GiB of float32 weights, where the ~5 ms a dynamic call pays is
    worth a copy of the weights per T (a 7B model's step is ~100x longer and its copies ~50x larger); "1"
    always, "0" never. Prefill chunks and the engine's B-row calls run on the dynamic model."""
    mode = os.environ.get("SPECEXPORT_OV_FIXED", "auto")
    if mode not in ("auto", "0", "1"):
        raise OptionError(f"SPECEXPORT_OV_FIXED must be auto, 0 or 1, got {mode!r}")
    if mode == "0" or (mode == "auto" and (root / entry.weights).stat().st_size > FIXED_MAX_BYTES):
        return []
    return sorted({T for name, T in entry.profiles.items() if not name.startswith("prefill")})


def fixed_shape(model, T: int):
    """A copy of `model` with its batch fixed at 1 and its new tokens at T; the cache length S stays dynamic.
    On a dynamic model the CPU plugin pays per node and per call for shapes it cannot know at compile time
    (~5 ms of a 26 ms bfloat16 SmolLM2 decode call over its ~980 nodes, 2 cores, AMX); with B and T fixed it
    does not, and it may pick other kernels (the logits differ from the dynamic model's in bfloat16, so a
    target's decode and verify calls both run fixed models, and the load-time check measures those). The
    cost is memory: each compiled model holds its own copy of the weights in the plugin's layout (~0.5 GB
    for SmolLM2, float32 or bfloat16)."""
    import openvino as ov

    m = model.clone()
    shapes = {}
    for x in m.inputs:
        name, dims = x.get_any_name(), list(x.get_partial_shape())
        if name in ("input_ids", "position_ids"):
            dims = [1, T]
        elif name == "new_mask":
            dims = [1, T, T]
        elif name == "past_mask":
            dims = [1, -1]
        elif name.startswith(("past_key.", "past_value.")):
            dims = [1, dims[1], -1, dims[3]]
        else:
            continue
        shapes[name] = ov.PartialShape(dims)
    m.reshape(shapes)
    return m


class _Stack(ctypes.Structure):  # stack_t (signal.h, Linux)
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]


@contextlib.contextmanager
def same_sigaltstack():
    """Give the calling thread back its alternate signal stack after the block. OpenVINO's compile_model
    (2026.4) installs one of its own on the calling thread (20 KB of anonymous memory) and can unmap it later
    while the thread still points at it; every Python signal handler runs on the alternate stack
    (SA_ONSTACK), so a Ctrl-C or SIGTERM after that killed the process with SIGSEGV instead of raising
    (found in the test suite: an OpenVINO load, then a SIGINT). Nothing of OpenVINO's handles a signal on
    it. Linux only; elsewhere, or if libc will not say, a no-op."""
    libc, old = None, _Stack()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.sigaltstack(None, ctypes.byref(old)) != 0:
                libc = None
    try:
        yield
    finally:
        if libc is not None:
            libc.sigaltstack(ctypes.byref(old), None)


class OvBackend(BackendBase):
    """One model of a slots or portable bundle on OpenVINO's CPU plugin; `precision` "f32", "bf16", or "int4"
    (float32 math, weights quantised at load: compress_weights)."""

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
        props = {"INFERENCE_PRECISION_HINT": "f32" if precision == "int4" else precision,
                 "INFERENCE_NUM_THREADS": str(threads), "PERFORMANCE_HINT": "LATENCY"}
        try:
            core = ov.Core()
            model = core.read_model(str(root / entry.graph))
            self.compressed = 0  # weight MatMuls quantised at load (precision "int4")
            if precision == "int4":
                a = entry.arch
                self.compressed = compress_weights(model, a["head_dim"], a["vocab_size"])
            with same_sigaltstack():
                self.compiled = core.compile_model(model, "CPU", props)
                self.fixed = {T: core.compile_model(fixed_shape(model, T), "CPU", props)
                              for T in fixed_ts(root, entry)}
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
        self.numerics = {"bf16": "bfloat16 math", "int4": "int4 weights"}.get(precision, "float32 math") + " (OpenVINO)"
        self.plain_only_fix = ("rebuild with --attention slots, or " if entry.attention == "portable" else "") + \
            "load it with backend='openvino' (float32)"
        self.precision, self.bundle_entry = precision, entry
        self.call_cost = CALL_COSTS[precision]
        self._measure()

    def _measure(self) -> None:
        """The build's verify-vs-decode check on the calls this backend makes now (the fixed models, or the
        dynamic one once they are dropped)."""
        if self.entry.role == "target" and self.entry.verify_ks():
            from ..runtime.prefill import measured_entry

            # bfloat16 rounds each partial sum: a tree node's attention over its ancestors in the call's slots
            # (not contiguous, as they are once committed) can differ from its decode call even where the
            # check's tree does not (measured: recycle on SmolLM2 differed on 1 of 13 Spec-Bench answers,
            # prompt lookup on none), so bfloat16 drafts are chains whatever the check says; int4 weights
            # (activations quantised per row) are measured: chains exact, trees 0.5 apart on SmolLM2
            self.entry = self.bundle_entry
            self.entry = measured_entry(self, trees=self.precision != "bf16")

    def drop_fixed(self) -> None:
        """Run every call on the dynamic model from now on; the batching engine calls this when it starts. Its
        B-row calls cannot use the fixed models (B = 1), and in bfloat16 those score tokens differently from
        the dynamic model (logits up to 0.17 apart on SmolLM2; 3 of 4 chat answers changed), so a batched
        request would not match a solo run on them. Solo runs from then on use the dynamic model too, and so
        match the engine's; the fixed models' memory is freed and the load-time check runs again."""
        if self.fixed:
            self.fixed = {}
            self._measure()

    @property
    def exact_trees(self) -> bool:
        """False: a tree's verify rows do not score as decode rows (measured at load), so recycle drafts its
        best path, a chain."""
        return self.entry.exact_trees

    def _request(self, scratch: dict, key, data, views, compiled=None):
        """An infer request of `compiled` (default the dynamic model) with `views` (a cache's layer buffers)
        set as the past inputs, kept in the cache's `scratch` until its buffer changes (a bucket growth): one
        per generation and T, one per (B, first) for the engine's pool. Setting 2L shared tensors costs ~2 ms,
        as much as a tenth of a decode call."""
        import openvino as ov

        held, req = scratch.get(key, (None, None))
        if held is not data:  # holding the old buffer keeps its address from being reused before this check
            req = req or (compiled or self.compiled).create_infer_request()
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
        T = len(ids)
        req = self._request(cache.scratch, ("ov", id(self), T), cache.data, cache.views(), self.fixed.get(T))
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
