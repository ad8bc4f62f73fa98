"""The ONNX Runtime backend (CPU; the default, torch-free): one model of a bundle on one InferenceSession.

The graph is loaded once (one copy of the weights in memory serves every profile) and runs `step` on exactly
the T values the manifest declares, `step_batch` on any B up to its largest batch size. It owns no cache: the
caller passes a RingKV (one sequence) or a KVPool (the engine's rows), so one loaded model serves any number of
generations.
"""
from __future__ import annotations

import os
from pathlib import Path
import time
import numpy as np

from .. import kernels
from ..bundle import BundleError, ModelEntry
from ..errors import OptionError
from ..runtime.kv import KVPool, RingKV
from .base import BackendBase, StepOut, batch_inputs, logit_rows, step_inputs


class OrtBackend(BackendBase):
    """One model on onnxruntime (CPU by default)."""

    def __init__(self, root: Path, entry: ModelEntry, buckets: list, threads: int | None = None,
                 providers: list | None = None, batch_sizes: list | None = None, weights: str = "float32"):
        import onnxruntime as ort

        super().__init__(entry, buckets, batch_sizes)
        if os.environ.get("SPECEXPORT_ORT_TELEMETRY") != "1":  # an embedded runtime does not phone home unless asked
            ort.disable_telemetry_events()
        self.fused = entry.attention == "fused"
        # a fused graph's GroupQueryAttention nodes run specexport's kernel where it builds (kernels/gqa.c;
        # CPU sessions only): None where onnxruntime's own runs
        cpu = providers in (None, ["CPUExecutionProvider"])
        self.kernel = kernels.library(entry.arch["head_dim"]) if self.fused and cpu else None
        # weights "bf16" (backend onnxruntime-bf16): the MatMul kernel holds the weights in bfloat16, float32 math;
        # "bf16dot" (onnxruntime-bf16dot): the activations rounded to bfloat16 too, products summed in pairs
        why = self._no_bf16(entry, cpu, weights) if weights != "float32" else None
        if why and entry.role == "target":
            raise OptionError(f"backend onnxruntime-{weights} holds the target's weights in specexport's MatMul "
                              f"kernel, but {why}; use backend onnxruntime (float32)")
        self.weights = "float32" if why else weights  # a draft that cannot only proposes in float32: still lossless
        # int4 or int8 weights with int8 activations (a target built so, or a quantised draft: drafts are built at
        # level 4): their MatMulNBits on specexport's kernel (kernels/matmul4.c)
        quant = entry.kind in ("int4", "int8")
        a8 = entry.activations == "int8" or entry.role == "draft"
        self.nbits = bool(self.kernel and quant and a8 and kernels.matmul4_on(self.kernel))
        self.session = ort.InferenceSession(str(root / entry.graph),
                                            session_options(threads, self.kernel, self.weights, self.nbits),
                                            providers=providers or ["CPUExecutionProvider"])
        # 1-token calls of one row get a pad token (`pad_decode`): not on specexport's MatMulNBits, whose rows (like
        # its attention kernel's) score alike however many share a call
        self.pad_decode = entry.pad_decode and not self.nbits
        # every MatMul and the attention on specexport's kernels: a row sums the same products in the same order
        # in a call of any T (tests/test_kernels.py), so single-row calls need not be padded to a profile
        self.any_t = bool(self.fused and self.kernel and (self.nbits or not quant)
                          and kernels.matmul_on(self.kernel, self.weights != "float32"))
        self.numerics = {"bf16": "float32 activations, bfloat16 weights",
                         "bf16dot": "bfloat16 activations and weights at the weight MatMuls"}.get(
            self.weights, f"{entry.activations or 'float32'} activations")
        if self.weights == "bf16dot" and kernels.matmul_amx(self.kernel):  # and its attention (kernels/gqa_amx.h)
            self.numerics += (" and the attention's products (AMX tiles)" if kernels.attention_amx(self.kernel)
                              else " (AMX tiles)")
        self.plain_only_fix = ("rebuild with --pad-decode (chain drafts then verify exactly), or with "
                               "--target-activations float32")
        self.root, self._mixed = root, None
        self.fixed_pool = self.fused  # GroupQueryAttention reads each row's n slots whatever S is
        # a fused graph without a new_kv output (built since 2026-12-03): its K/V are only written in place,
        # so commit moves them within the cache (StepOut.new_kv None)
        self.in_place = self.fused and "new_kv" not in {o.name for o in self.session.get_outputs()}
        self.top_k = next((o["shape"][-1] for o in entry.outputs if o["name"] == "top_ids"), 0)
        self.row_input = any(i["name"] == "logit_rows" for i in entry.inputs)  # bundles before it: all rows
        if entry.attention not in ("fused", "portable", "slots"):
            raise BundleError(f"{entry.role}: unknown attention kind {entry.attention!r}: rebuild the bundle")
        bf16 = self.weights != "float32" and entry.role == "target"
        if (entry.pad_decode and entry.verify_drift is not None or bf16) and entry.speculative and entry.verify_ks():
            # a built --pad-decode target, or bfloat16 weights (which the build did not check): measure, on this
            # onnxruntime, that a chain's verify rows score as its decode calls do (the build did on its own;
            # another onnxruntime's kernels may not): beyond the tolerance it loads plain-only (~0.3 s for
            # SmolLM2)
            from ..runtime.prefill import measured_entry

            self.entry = measured_entry(self)

    def _no_bf16(self, entry: ModelEntry, cpu: bool, weights: str) -> str | None:
        """Why this model cannot hold bfloat16 weights (they exist only in specexport's MatMul kernel), or None."""
        return ("its graph is not fused (build without --attention, or with --attention fused)" if not self.fused else
               "it runs on the CPU only" if not cpu else
               f"int4/int8 weights are not float32 MatMuls ({entry.role} is {entry.kind})" if entry.kind in ("int4", "int8") else
               "specexport's kernels are off or did not build (SPECEXPORT_KERNELS=0, no C compiler, or an "
               f"unsupported head size {entry.arch['head_dim']})" if not self.kernel else
               "SPECEXPORT_MATMUL=0 turns its MatMul kernel off" if not kernels.matmul_on(self.kernel, True) else
               "this CPU has no avx512_bf16 (VDPBF16PS); backend onnxruntime-bf16 runs anywhere"
               if weights == "bf16dot" and not kernels.matmul_dot(self.kernel) else None)

    @property
    def exact_trees(self) -> bool:
        """False: a tree's verify rows do not score as decode rows (the manifest's note, as measured at load), so
        recycle drafts its best path, a chain."""
        return self.entry.exact_trees

    def step(self, cache: RingKV, ids, start: int, new_mask: np.ndarray | None = None,
             positions: np.ndarray | None = None, rows: list | None = None) -> StepOut:
        """Run T = len(ids) new tokens at positions start.. (or `positions`, for a tree) against `cache`;
        new_mask [1,T,T] says which new tokens each one sees (default causal); logits (and top ids) of `rows`
        only (default all T; a fused graph then skips the LM head of the others).

        Committed slots are read, never written (a fused graph writes this step's K/V into the free slots
        after them): commit the rows you accept with cache.commit(out.new_kv, rows), before the next call."""
        T = len(ids)
        self.check_profile(T)
        if self.pad_decode and T == 1:
            (ids,), positions, new_mask, rows, real = pad_decode(
                np.asarray(ids)[None], None if positions is None else np.asarray(positions)[None], rows)
            return real(self._step(cache, ids, start, new_mask, None if positions is None else positions[0], rows))
        return self._step(cache, ids, start, new_mask, positions, rows)

    def _step(self, cache: RingKV, ids, start, new_mask, positions, rows) -> StepOut:
        T = len(ids)
        cache.reserve(start + T)
        if self.fused:
            return self._step_fused(cache, ids, start, new_mask, positions, rows)
        feeds = step_inputs(cache, ids, start, new_mask, positions)
        feeds.update(zip(self.kv_names, cache.views()))
        if self.row_input:  # a slots graph: the LM head of the rows asked for only
            feeds["logit_rows"] = logit_rows(T, rows)
        t = time.perf_counter()
        logits, new_kv = self.session.run(None, feeds)
        out = StepOut(logits[0], new_kv, time.perf_counter() - t)
        return out if self.row_input else out.only(rows)

    def _step_fused(self, cache: RingKV, ids, start, new_mask, positions, rows) -> StepOut:
        """GroupQueryAttention graph: the cache's layer buffers are bound as both past and present, so the
        node attends over slots [0, n) + the new tokens and writes their K/V into slots n..n+T-1, which are
        free (commit moves the accepted ones down within the cache, or copies them from new_kv where an
        older graph outputs it). No wrap-around: n+T <= S."""
        T, n = len(ids), cache.n
        if n + T > cache.S:
            raise ValueError(f"{self.entry.role}: {n} cached + {T} new tokens exceed the capacity {cache.S} "
                             "(fused attention does not wrap around): lower max_new_tokens or rebuild with a "
                             "larger --capacity")
        x = step_inputs(cache, ids, start, new_mask, positions)
        feeds = fused_feeds(np.array([n]), x["input_ids"], x["position_ids"], x["new_mask"])
        R = T
        if self.row_input:
            feeds["logit_rows"] = logit_rows(T, rows)
            R = len(feeds["logit_rows"])
        logits = np.empty((1, R, self.vocab), dtype=np.float32)
        outs = {"logits": logits}
        new_kv = outs["new_kv"] = self._new_kv(1, T)
        if self.top_k:
            outs["top_ids"] = np.empty((1, R, self.top_k), dtype=np.int64)
        run_s = self._run_bound(self._binding(cache), feeds, outs)
        out = StepOut(logits[0], new_kv, run_s, outs["top_ids"][0] if self.top_k else None)
        return out if self.row_input else out.only(rows)

    def _new_kv(self, B: int, T: int) -> np.ndarray | None:
        """The new_kv output's buffer [L,2,B,Hkv,T,D], or None for a graph that writes in place only."""
        if self.in_place:
            return None
        L, Hkv, D = self.dims
        return np.empty((L, 2, B, Hkv, T, D), dtype=np.float32)

    def _run_bound(self, io, feeds: dict, outs: dict, session=None) -> float:
        """Bind the step's small inputs and preallocated outputs to `io` (its cache already bound), run ->
        seconds inside the run call (on `session`, default the model's)."""
        for name, a in feeds.items():
            io.bind_cpu_input(name, a)
        for name, a in outs.items():
            if a is not None:
                io.bind_output(name, "cpu", 0, a.dtype.type, list(a.shape), a.ctypes.data)
        t = time.perf_counter()
        (session or self.session).run_with_iobinding(io)
        return time.perf_counter() - t

    def _binding(self, cache: RingKV):
        """This generation's IO binding, the cache's layer buffers bound (no copy) as past and present once
        per buffer (it changes only when the cache grows to the next bucket)."""
        data, io = cache.scratch.get("ort", (None, None))
        if data is not cache.data:  # holding the old buffer keeps its address from being reused before this check
            io = bind_cache(self.session.io_binding(), zip(self.kv_names, cache.views()))
            cache.scratch["ort"] = (cache.data, io)
        return io

    # ---- many sequences per call (the engine)
    def runs_batch(self, B: int) -> bool:
        """Any B up to the largest built: the graphs are symbolic in B and every row's numbers are computed
        apart from the other rows' (the same GEMM kernels per row, attention per row), so a call of 6 busy
        rows need not pay for 8; the build's B > 1 parity profile stands for them."""
        return 1 <= B <= self.batch_sizes[-1]

    def batch_ts(self, B: int) -> list[int]:
        """The T values a call of B rows can run: every profile; but with fused attention on onnxruntime's own
        GroupQueryAttention kernel (specexport's did not build) T=1 only for B > 1: that kernel refuses
        several new tokens per row when a batch has a past (a first prefill chunk, every row at n = 0, is the
        exception: see `step_batch`)."""
        ts = sorted(self.profile_ts)
        return [1] if self.fused and B > 1 and not self.kernel else ts

    def step_batch(self, pool: KVPool, ids: np.ndarray, positions: np.ndarray,
                   new_mask: np.ndarray | None = None, first: int = 0, rows=None) -> StepOut:
        """One call for pool rows [first, first+B): ids and positions [B,T], new_mask [B,T,T] (default
        causal). Row b attends over its own committed slots and its new tokens; rows with nothing to do are
        fed padding (their writes land in free slots past their n, never committed). `rows`: the T indices
        that get logits in every row (default all). -> logits [B,R,V], new_kv [L,2,B,Hkv,T,D], top ids
        [B,R,k] (fused); nothing is committed.

        T > 1 with B > 1 on a fused graph without specexport's kernel only when every row is at n = 0 (first
        prefill chunks: the node's "first prompt" mode, which takes a batch)."""
        B, T = ids.shape
        n = pool.n[first:first + B].astype(np.int64)
        prefill = self.fused and B > 1 and T in self.profile_ts and not n.any()
        if (not self.runs_batch(B) or (T not in self.batch_ts(B) and not prefill and not self.any_t)
                or first + B > pool.rows):
            raise ValueError(f"{self.entry.role} has no batch profile B={B}, T={T} for rows {first}.. (batch "
                             f"sizes {self.batch_sizes}, T {self.batch_ts(B)} at B={B}, T>1 at B>1 on first "
                             f"prefill chunks only)")
        real = None
        if self.pad_decode and B == T == 1:
            ids, positions, new_mask, rows, real = pad_decode(ids, positions, rows)
        out = self._step_batch(pool, ids, positions, new_mask, first, rows, n)
        return out if real is None else real(out)

    def _step_batch(self, pool, ids, positions, new_mask, first, rows, n) -> StepOut:
        B, T = ids.shape
        pool.reserve(int(n.max()) + T)
        pick = None if rows is None else np.asarray(rows, dtype=np.int64)
        if not self.fused:
            feeds = batch_inputs(pool, ids, positions, new_mask, first, pick, self.row_input)
            feeds.update(zip(self.kv_names, pool.views(B, first)))
            t = time.perf_counter()
            logits, new_kv = self.session.run(None, feeds)
            return StepOut(logits if pick is None or self.row_input else logits[:, pick], new_kv,
                           time.perf_counter() - t)
        feeds = fused_feeds(n, ids, positions, new_mask)
        if self.row_input:
            feeds["logit_rows"] = logit_rows(T, pick)
        R = len(feeds["logit_rows"]) if self.row_input else T
        outs = {"logits": np.empty((B, R, self.vocab), dtype=np.float32), "new_kv": self._new_kv(B, T)}
        if self.top_k:
            outs["top_ids"] = np.empty((B, R, self.top_k), dtype=np.int64)
        run_s = self._run_bound(self._pool_binding(pool, B, first), feeds, outs)
        logits, top = outs["logits"], outs.get("top_ids")
        if pick is not None and not self.row_input:
            logits, top = logits[:, pick], None if top is None else top[:, pick]
        return StepOut(logits, outs["new_kv"], run_s, top)

    def _pool_binding(self, pool: KVPool, B: int, first: int = 0):
        """An IO binding with rows [first, first+B) of the pool bound (no copy) as past and present of every
        layer; kept until the pool's buffer is reallocated."""
        key = (id(self), B, first)
        io = pool.scratch.get(key)
        if io is None:
            io = bind_cache(self.session.io_binding(), zip(self.kv_names, pool.views(B, first)))
            pool.scratch[key] = io
        return io

    # ---- the mixed graph (a fused target's `mixed` note): a batch and single-sequence groups in one call
    @property
    def groups(self) -> int:
        """How many single-sequence groups a mixed call can carry (0: no mixed graph)."""
        return self.entry.mixed["groups"] if self.entry.mixed and self.fused else 0

    def _mixed_session(self):
        """The mixed graph's InferenceSession, opened at its first use (the engine's warm start): a second
        session, so its prepacked weights are a second copy in memory (the file shares the weights on disk)."""
        if self._mixed is None:
            import onnxruntime as ort

            try:
                sess = ort.InferenceSession(str(self.root / self.entry.mixed["graph"]),
                                            session_options(None, self.kernel, self.weights, self.nbits),
                                            providers=self.session.get_providers())
            except Exception as e:  # noqa: BLE001 -- whatever onnxruntime raises on a bad graph
                raise BundleError(f"{self.entry.mixed['graph']}: onnxruntime cannot load the mixed graph "
                                  f"({str(e)[:300]}): rebuild the bundle") from None
            want = mixed_names(self.kv_names, self.groups, new_kv=not self.in_place)
            got = ([i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])
            if got != want:
                raise BundleError(f"{self.entry.mixed['graph']}: its inputs/outputs are not those of a mixed graph "
                                  f"with {self.groups} groups: the bundle was changed; rebuild it")
            self._mixed = sess
        return self._mixed

    def step_mixed(self, pool: KVPool, ids: np.ndarray, positions: np.ndarray, new_mask: np.ndarray | None,
                   group: list, first: int = 0, rows=None) -> tuple[StepOut, list]:
        """ONE call of the mixed graph: the batch as `step_batch` (pool rows [first, first+B), ids and
        positions [B,T]; on onnxruntime's own attention kernel T > 1 needs B = 1 or every row at n = 0) and each
        group (r, ids [Tg], positions [Tg], new_mask [Tg,Tg] or None for causal, logit rows or None for all) on
        pool row r, one batch-1 attention each. A group's row inside the batch is fed there as padding that
        writes one slot past the group's tokens (it needs n_r + Tg + T <= S). -> (the batch's StepOut, one StepOut per group, logits [Rg,V],
        new_kv [L,2,1,Hkv,Tg,D]); nothing is committed."""
        B, T = ids.shape
        P = self.groups
        if not 1 <= len(group) <= P:
            raise ValueError(f"{self.entry.role}: a mixed call takes 1..{P} groups, got {len(group)}")
        if not self.runs_batch(B) or first + B > pool.rows or (T > 1 and B > 1 and pool.n[first:first + B].any()
                                                                 and not self.kernel):
            raise ValueError(f"{self.entry.role}: no mixed batch B={B}, T={T} for rows {first}..")
        n = pool.n[first:first + B].astype(np.int64)
        ids, positions = ids.copy(), positions.copy()
        for r, g_ids, *_ in group:
            if first <= r < first + B:  # the group's row as batch padding: its one write lands after the group's
                b = r - first
                n[b] += len(g_ids)
                ids[b], positions[b] = 0, n[b] + np.arange(T)
        need = max(int(n.max()) + T, *(int(pool.n[r]) + len(g[1]) for g in group))
        if need > pool.S:
            raise ValueError(f"{self.entry.role}: a mixed call needs {need} slots, the pool has {pool.S}")
        pool.reserve(need)
        feeds = fused_feeds(n, ids, positions, new_mask)
        feeds["logit_rows"] = logit_rows(T, rows)
        L, Hkv, D = self.dims
        R = len(feeds["logit_rows"])
        sizes, kvs = [B * R], [self._new_kv(B, T)]
        for j in range(1, P + 1):
            if j <= len(group):
                r, g_ids, g_pos, g_mask, g_rows = group[j - 1]
                g_ids = np.asarray(g_ids, dtype=np.int64)[None]
                f = fused_feeds(pool.n[r:r + 1].astype(np.int64), g_ids, np.asarray(g_pos, dtype=np.int64)[None],
                                None if g_mask is None else np.asarray(g_mask)[None])
                f["logit_rows"] = logit_rows(g_ids.shape[1], g_rows)
            else:  # an unused group: one token on a 2-slot scratch buffer, no logits
                f = fused_feeds(np.zeros(1, dtype=np.int64), np.zeros((1, 1), dtype=np.int64),
                                np.zeros((1, 1), dtype=np.int64), None)
                f["logit_rows"] = np.zeros(0, dtype=np.int64)
            feeds.update({f"{k}.{j}": v for k, v in f.items()})
            sizes.append(len(f["logit_rows"]))
            kvs.append(self._new_kv(1, f["input_ids"].shape[1]))
        key = ("mixed", id(self), B, first, tuple(g[0] for g in group))
        io = pool.scratch.get(key)
        if io is None:
            views = list(zip(self.kv_names, pool.views(B, first)))
            for j in range(1, P + 1):
                if j <= len(group):
                    r = group[j - 1][0]
                    views += [(f"{name}.{j}", v[r:r + 1]) for name, v in zip(self.kv_names, pool.views(pool.rows))]
                else:
                    scratch = pool.scratch.setdefault(("mixed-scratch", j), [
                        np.zeros((1, Hkv, 2, D), dtype=np.float32) for _ in self.kv_names])
                    views += [(f"{name}.{j}", v) for name, v in zip(self.kv_names, scratch)]
            io = bind_cache(self._mixed_session().io_binding(), views)
            pool.scratch[key] = io
        logits = np.empty((sum(sizes), self.vocab), dtype=np.float32)
        top = np.empty((sum(sizes), self.top_k), dtype=np.int64)
        outs = {"logits": logits, "top_ids": top, "new_kv": kvs[0]}
        outs.update({f"new_kv.{j}": kvs[j] for j in range(1, P + 1)})  # None (not bound): written in place
        run_s = self._run_bound(io, feeds, outs, self._mixed_session())
        cut = np.cumsum(sizes)[:-1]
        ls, ts = np.split(logits, cut), np.split(top, cut)
        batch = StepOut(ls[0].reshape(B, R, -1), kvs[0], run_s, ts[0].reshape(B, R, -1))
        return batch, [StepOut(ls[j], kvs[j], run_s, ts[j]) for j in range(1, len(group) + 1)]


def pad_decode(ids: np.ndarray, positions, rows):
    """A 1-token call of one row (ids, positions [1,1]) as a 2-token call: the token and a pad, a copy of it at
    the next position (its K/V go to the free slot after the token's, never committed; the capacity always
    has that slot, since a token is fed only when another one follows it). Why: GroupQueryAttention
    multiplies a row's attention weights by V as a matrix product of T rows, and at T = 1 onnxruntime takes
    a matrix-vector kernel that sums in another order than its T >= 2 kernel; so a decode call scores a token
    differently from a verify call after the same cache (0.3-0.9 logits on SmolLM2 int4 with int8
    activations, where the rounding cascades), and with the pad not at all (0.0 for chains:
    experiments/a8_rows_probe.py). -> (ids, positions, new_mask, rows, real): real(StepOut) cuts the result
    back to the token asked for."""
    ids = np.concatenate([ids, ids], axis=1)
    if positions is not None:
        positions = np.concatenate([positions, positions + 1], axis=1)
    rows = [0] if rows is None else rows  # the pad's logits are never wanted

    def real(out: StepOut) -> StepOut:
        return out if out.new_kv is None else out._replace(new_kv=out.new_kv[..., :1, :])
    return ids, positions, None, rows, real  # new_mask None: causal, the token sees itself, the pad both


def bind_cache(io, views):
    """Bind each (past name, buffer view) of `views` to `io` without a copy as that past input and as its
    present output (the same buffer: GroupQueryAttention writes the new K/V in place) -> io."""
    import onnxruntime as ort

    for name, view in views:
        ov = ort.OrtValue.ortvalue_from_numpy(view)
        io.bind_ortvalue_input(name, ov)
        io.bind_ortvalue_output("present_" + name[len("past_"):], ov)
    return io


_POOL: list = []  # the size of onnxruntime's global thread pool, once set


def session_options(threads: int | None = None, kernel: str | None = None, weights: str = "float32",
                    nbits: bool = False):
    """SessionOptions of every CPU session the runtime opens (and scripts that open their own beside it): on
    onnxruntime's ONE global intra-op thread pool, whose size the first call of the process sets (`threads`,
    else $SPECEXPORT_THREADS, else the CPU count). A target and its draft, or a target's step and mixed graphs,
    alternate call by call; with a pool per session the idle one's spinning threads took the cores from the
    other (a mixed call right after a step-graph call ran 1.9x its time alone on 2 cores), and a pool that
    did not spin paid a wake-up per parallel section (+23%). Shared threads do neither. `kernel`: the path of
    specexport's kernel library (kernels.library) to register, or None; `weights` "bf16": its MatMul packs the
    weights as bfloat16, "bf16dot": as bfloat16 pairs for VDPBF16PS (the caller checks kernels.matmul_on and
    matmul_dot first); `nbits`: its MatMulNBits for int4 weights with int8 activations (kernels.matmul4_on)."""
    import onnxruntime as ort
    import onnxruntime.capi._pybind_state as C

    if not _POOL:
        _POOL.append(threads or int(os.environ.get("SPECEXPORT_THREADS", 0)) or (os.cpu_count() or 1))
        C.set_global_thread_pool_sizes(_POOL[0], 1)
    so = ort.SessionOptions()
    so.use_per_session_threads = False
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if kernel:
        if weights in ("bf16", "bf16dot"):  # read by the library as it registers its ops (kernels/gqa.c)
            so.add_session_config_entry("specexport.matmul_weights", weights)
        if nbits:
            so.add_session_config_entry("specexport.matmul_nbits", "int8")
        so.register_custom_ops_library(kernel)
        kernels.set_threads(kernel, _POOL[0])
    return so


def fused_feeds(n: np.ndarray, ids: np.ndarray, positions: np.ndarray, new_mask) -> dict:
    """A GroupQueryAttention call's inputs for rows at cache lengths n [B] with new tokens ids/positions [B,T]
    and new_mask [B,T,T] (None: causal): attn_bias (cached slots [0, n_b) visible, then the new tokens as
    new_mask says), seqlens_k, total_len."""
    B, T = ids.shape
    if new_mask is None:
        new_mask = np.broadcast_to(np.tril(np.ones((T, T), dtype=bool)), (B, T, T))
    total = int(n.max()) + T
    bias = np.full((B, 1, T, total), -np.inf, dtype=np.float32)
    for b in range(B):
        bias[b, 0, :, :n[b]] = 0.0
        bias[b, 0, :, n[b]:n[b] + T] = np.where(new_mask[b], 0.0, -np.inf)
    return {"input_ids": ids.astype(np.int64), "position_ids": positions.astype(np.int64), "attn_bias": bias,
            "seqlens_k": (n + T - 1).astype(np.int32), "total_len": np.array(total, dtype=np.int32)}


def mixed_names(kv_names: list, groups: int, new_kv: bool = False) -> tuple[list, list]:
    """The mixed graph's input and output names in order (exporter/onnx.py writes them so; `new_kv`: a
    bundle built before the new tokens' K/V were only written in place also outputs them)."""
    per = ["input_ids", "position_ids", "attn_bias", "seqlens_k", "total_len", "logit_rows"]
    present = ["present_" + n[len("past_"):] for n in kv_names]
    ins = per + kv_names + [f"{n}.{j}" for j in range(1, groups + 1) for n in per + kv_names]
    outs = (["logits", "top_ids"] + (["new_kv"] + [f"new_kv.{j}" for j in range(1, groups + 1)] if new_kv else [])
            + present + [f"{n}.{j}" for j in range(1, groups + 1) for n in present])
    return ins, outs
