"""KV ring buffer: one preallocated cache per model per generation; commit writes rows, rollback writes nothing.

The token at absolute position p lives in slot p mod S. `n` is the committed length: positions [0, n) are
in the cache (only the last S of them, for a sliding-window model). A step's new K/V come back from the
graph as new_kv [L,2,B,Hkv,T,D]; `commit` copies the accepted rows into their slots and advances n.
Rejected rows are never committed (a fused step writes its rows into the free slots after n, where the
next step overwrites them), so rollback is simply committing fewer rows.
Keys are stored already rotated at their absolute position, so wrap-around needs no re-rotation.

Capacity buckets: the buffer starts at the smallest bucket and `reserve` moves it to the next bucket when
the sequence outgrows it (one copy per growth, amortised), so attention reads O(context) slots, not S.
"""
from __future__ import annotations

import numpy as np


class RingKV:
    def __init__(self, layers: int, kv_heads: int, buckets, head_dim: int, dtype=np.float32):
        self.buckets = sorted(buckets)
        self.S = self.buckets[0]
        self.data = self._zeros((layers, 2, 1, kv_heads, self.S, head_dim), dtype)  # [L,2,B,Hkv,S,D]
        self.n = 0
        self._slot = np.arange(self.S)
        self.scratch: dict = {}  # a backend's buffers for this generation (threads never share a cache)

    def reserve(self, n: int) -> None:
        """Make room for positions [0, n): grow to the smallest bucket >= n (the largest, at most)."""
        if n <= self.S or self.S == self.buckets[-1]:
            return
        S = next((b for b in self.buckets if b >= n), self.buckets[-1])
        grown = self._zeros(tuple(self.data.shape[:4]) + (S, self.data.shape[5]), self.data.dtype)
        grown[:, :, :, :, :self.S] = self.data  # positions < old S keep their slots (no wrap yet)
        self.data, self.S, self._slot = grown, S, np.arange(S)

    # array backend: numpy here; a device backend overrides these two (see torch_backend.TorchRingKV)
    @staticmethod
    def _zeros(shape, dtype):
        return np.zeros(shape, dtype=dtype)

    @staticmethod
    def _index(idx: np.ndarray):
        return idx

    def views(self) -> list[np.ndarray]:
        """past_key.0, past_value.0, past_key.1, ...: zero-copy [B,Hkv,S,D] views into the buffer."""
        L = self.data.shape[0]
        return [self.data[i, j] for i in range(L) for j in (0, 1)]

    def mask(self) -> np.ndarray:
        """past_mask [B,S]: slots holding one of the last min(n, S) committed positions."""
        return (self._slot < self.n)[None] if self.n <= self.S else np.ones((1, self.S), dtype=bool)

    def commit(self, new_kv: np.ndarray, rows, count: int | None = None) -> None:
        """Write new_kv rows `rows` (indices into T) at positions n, n+1, ... and advance n by len(rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        if count is not None:
            rows = rows[:count]
        m = len(rows)
        if m == 0:
            return
        self.reserve(self.n + m)
        slots = (self.n + np.arange(m)) % self.S
        # new_kv: [L,2,B,Hkv,T,D] -> the chosen rows into their ring slots
        self.data[:, :, :, :, self._index(slots), :] = new_kv[:, :, :, :, self._index(rows), :]
        self.n += m

    def truncate(self, n: int) -> None:
        """Forget committed positions >= n (their slots become free again)."""
        if n > self.n:
            raise ValueError(f"cannot truncate a cache of {self.n} positions to {n}")
        self.n = n
