"""What every backend shares: the step's result (StepOut), the Backend protocol, the step's token inputs,
and BackendBase, the preamble (which model, its cache dimensions, the T and B values it may run).

Pure numpy: the torch-free runtime imports this module and nothing else of the backends package except
through `specexport.backends.open_model`.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ..bundle import ModelEntry
from ..errors import OptionError
from ..runtime.kv import KVPool, RingKV


class StepOut(NamedTuple):
    logits: np.ndarray  # [T,V] float32; [len(rows),V] when the step was asked for some rows only
    new_kv: np.ndarray | None  # [L,2,B,Hkv,T,D] K (rotated) and V of the T new tokens; None: written in place
    # at slots n..n+T-1 of each row (a fused graph), where commit finds them
    run_s: float  # seconds inside the backend's run call
    top: np.ndarray | None = None  # [T,k] int64 each row's largest logits first, when the graph outputs them

    def only(self, rows) -> "StepOut":
        """These rows of the logits (and top ids): what a backend whose graph computes every row returns."""
        return self if rows is None else self._replace(
            logits=self.logits[rows], top=None if self.top is None else self.top[rows])


class Backend(Protocol):
    entry: ModelEntry
    batch_sizes: list

    def new_cache(self) -> RingKV: ...

    def step(self, cache: RingKV, ids, start: int, new_mask: np.ndarray | None = None,
             positions: np.ndarray | None = None, rows: list | None = None) -> StepOut: ...


def step_inputs(cache: RingKV, ids, start: int, new_mask=None, positions=None) -> dict:
    """A step's token inputs as numpy arrays: positions start.. unless given (a tree's per node), past_mask
    from the cache, new_mask [1,T,T] causal unless given. Every backend feeds these."""
    T = len(ids)
    return {"input_ids": np.asarray(ids, dtype=np.int64)[None],
            "position_ids": (np.arange(start, start + T) if positions is None else np.asarray(positions))
            .astype(np.int64)[None],
            "past_mask": cache.mask(),
            "new_mask": np.tril(np.ones((T, T), dtype=bool))[None] if new_mask is None else np.asarray(new_mask)}



def logit_rows(T: int, rows) -> np.ndarray:
    """The `logit_rows` input of a graph that has one: the rows asked for, default all T."""
    return np.arange(T, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)


def batch_inputs(pool: KVPool, ids: np.ndarray, positions: np.ndarray, new_mask, first: int, rows,
                 row_input: bool) -> dict:
    """A portable or slots graph's token inputs for pool rows [first, first+B): ids and positions [B,T], each
    row's past_mask from its committed length, new_mask [B,T,T] (default causal), and logit_rows where the
    graph has that input. Every backend that runs those graphs on a pool feeds these."""
    B, T = ids.shape
    n = pool.n[first:first + B]
    if new_mask is None:
        new_mask = np.repeat(np.tril(np.ones((1, T, T), dtype=bool)), B, axis=0)  # writeable (OpenVINO shares it)
    feeds = {"input_ids": ids.astype(np.int64), "position_ids": positions.astype(np.int64),
             "past_mask": np.arange(pool.S)[None] < n[:, None], "new_mask": np.ascontiguousarray(new_mask)}
    if row_input:
        feeds["logit_rows"] = logit_rows(T, rows)
    return feeds


class BackendBase:
    """entry, buckets (S values, the last = capacity), dims = (L, Hkv, D), vocab, the profile T values and
    the batch sizes; new_cache / new_pool / check_profile on them."""

    host_cache = True  # the cache is a numpy array in host memory (device backends: False)
    fixed_pool = False  # True where a call reads only each row's committed slots: its pool is never resized
    # True where a call of one row may take any T, not only the profiles': its graph is symbolic in T and every
    # row's numbers are the same whatever T (specexport's kernels), so a prefill feeds its last chunk unpadded
    any_t = False

    def __init__(self, entry: ModelEntry, buckets: list, batch_sizes: list | None = None):
        a = entry.arch
        self.entry = entry
        self.buckets = sorted(buckets)
        self.capacity = self.buckets[-1]
        self.dims = (a["num_layers"], a["num_kv_heads"], a["head_dim"])  # L, Hkv, D
        self.vocab = a["vocab_size"]
        self.profile_ts = set(entry.profiles.values())
        self.batch_sizes = sorted(batch_sizes or [1])
        self.kv_names = entry.kv_inputs()

    def new_cache(self) -> RingKV:
        L, Hkv, D = self.dims
        return RingKV(L, Hkv, self.buckets, D)

    def new_pool(self, rows: int) -> KVPool:
        L, Hkv, D = self.dims
        return KVPool(L, Hkv, self.buckets, D, rows, fixed=self.fixed_pool)

    def runs_batch(self, B: int) -> bool:
        """Whether a call of B rows runs: the built batch sizes (a backend whose graph takes any B says so)."""
        return B in self.batch_sizes

    def batch_for(self, rows: int) -> int:
        """The B of a call over pool rows [0, rows): the smallest batch size this backend runs that holds them."""
        return next(b for b in range(rows, self.batch_sizes[-1] + 1) if self.runs_batch(b))

    def batch_call(self, pool: KVPool, ids: np.ndarray, first: int) -> tuple[int, int]:
        """(B, T) of a call of ids [B,T] on pool rows [first, first+B) for a graph that runs any profile T at
        any B it `runs_batch` (portable, slots): checked against both, the pool reserved for it."""
        B, T = ids.shape
        if not self.runs_batch(B) or T not in self.profile_ts or first + B > pool.rows:
            raise ValueError(f"{self.entry.role} has no batch profile B={B}, T={T} for rows {first}.. "
                             f"(batch sizes {self.batch_sizes}, T {sorted(self.profile_ts)})")
        pool.reserve(int(pool.n[first:first + B].max()) + T)
        return B, T

    def check_profile(self, T: int) -> None:
        if T not in self.profile_ts and not (self.any_t and T >= 1):
            raise OptionError(f"{self.entry.role} has no profile with T={T} (built: {sorted(self.profile_ts)})")
