"""KV ring buffer: one preallocated cache per model per generation; commit writes rows, rollback writes nothing.

The token at absolute position p lives in slot p mod S. `n` is the committed length: positions [0, n) are
in the cache (only the last S of them, for a sliding-window model). A step's new K/V come back from the
graph as new_kv [L,2,B,Hkv,T,D]; `commit` copies the accepted rows into their slots and advances n. A fused
graph instead writes its T rows into the free slots n..n+T-1 itself (new_kv None): `commit` then moves the
accepted rows down to n, n+1, ... within the buffer (nothing to move when they are the first ones: a chain's
accepted prefix, a prefill chunk, a decode token), so it must come before anything else writes those slots.
Rejected rows are never committed (the next step overwrites their free slots), so rollback is simply
committing fewer rows.
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

    # array backend: numpy here; a device backend overrides these two (see backends/torch_graphs.OnDevice)
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

    def commit(self, new_kv: np.ndarray | None, rows, count: int | None = None) -> None:
        """Write new_kv rows `rows` (indices into T) at positions n, n+1, ... and advance n by len(rows);
        new_kv None: the step wrote its rows into slots n.. in place (a fused graph), move them."""
        rows = np.asarray(rows, dtype=np.int64)
        if count is not None:
            rows = rows[:count]
        m = len(rows)
        if m == 0:
            return
        if new_kv is None:
            moved = in_place(rows)
            if moved is not None:  # no wrap-around: a fused graph's n + T fits S
                self.data[:, :, :, :, self.n + moved] = self.data[:, :, :, :, self.n + rows[moved]]
            self.n += m
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


def in_place(rows: np.ndarray) -> np.ndarray | None:
    """Accepted rows (indices into the step's T) that a step wrote in place at slots n + row -> the places j
    whose row is not j (slot n + j takes slot n + rows[j]: an indexed read, which numpy gathers into a copy
    before it writes), or None: nothing moves (a chain's accepted prefix, a chunk, a decode token)."""
    moved = np.flatnonzero(rows != np.arange(len(rows)))
    return moved if len(moved) else None


class KVPool:
    """One preallocated cache for many sequences: data [L,2,R,Hkv,S,D], R rows (the engine's largest batch),
    each row one request's cache with its own committed length n[r]. A request takes a row when admitted
    (lowest free first, so a batch call covers rows [0, B) with B small) and gives it back when it ends;
    commit and rollback are per row, exactly as RingKV's (rows here never wrap: slot = position).

    Buckets: S follows the longest row. It grows to the next bucket when a row needs it (one copy of the
    pool) and shrinks back when the long rows have left (another copy), so short requests do not keep
    paying for a long one that finished: a portable or slots graph reads all S slots of every row in the
    batch (masked). `fixed=True` (a fused graph, which reads only each row's own n[r] slots whatever S is):
    S is the capacity from the start and never changes, so no request waits on a copy of the pool. The
    buffer is zero-filled lazily by the OS (np.zeros of this size maps untouched pages), so its resident
    memory is the slots rows have written, not rows x capacity."""

    def __init__(self, layers: int, kv_heads: int, buckets, head_dim: int, rows: int, dtype=np.float32,
                 fixed: bool = False):
        self.buckets = sorted(buckets)
        self.fixed = fixed
        self.S = self.buckets[-1] if fixed else self.buckets[0]
        self.rows = rows
        self.data = self._zeros((layers, 2, rows, kv_heads, self.S, head_dim), dtype)
        self.n = np.zeros(rows, dtype=np.int64)
        self.high = np.zeros(rows, dtype=np.int64)  # slots each row has had committed (fixed: pages touched)
        self.free = list(range(rows))
        self._peak = self.data.nbytes  # the largest the buffer has been (bucketed)
        self.generation = 0  # bumps whenever `data` is reallocated (backends cache bindings per generation)
        self.scratch: dict = {}  # a backend's bindings of this buffer (cleared when it is reallocated)

    _zeros, _index = staticmethod(RingKV._zeros), staticmethod(RingKV._index)  # a device pool overrides both

    def acquire(self) -> int | None:
        if not self.free:
            return None
        self.free.sort()
        r = self.free.pop(0)
        self.n[r] = 0
        return r

    def release(self, r: int) -> None:
        self.n[r] = 0
        self.free.append(r)

    def _resize(self, S: int) -> None:
        # only the committed slots move (slots past every row's n hold nothing anyone reads back); the rest
        # of the new buffer stays zero, so a portable graph's masked reads of free slots see finite values
        keep = min(S, self.S, int(self.n.max()))
        grown = self._zeros(tuple(self.data.shape[:4]) + (S, self.data.shape[5]), self.data.dtype)
        grown[:, :, :, :, :keep] = self.data[:, :, :, :, :keep]
        self.data, self.S = grown, S
        self._peak = max(self._peak, grown.nbytes)
        self.generation += 1
        self.scratch.clear()

    @property
    def resident_bytes(self) -> int:
        """The buffer's bytes in memory: all of it when bucketed; for a fixed pool about the slots rows have
        written (np.zeros pages are mapped when first written; a row's slots [0, high) per layer, head)."""
        if not self.fixed:
            return int(self.data.nbytes)
        return int(self.high.sum()) * self.data[:, :, 0, :, 0].nbytes

    @property
    def peak_bytes(self) -> int:
        """The most resident_bytes has been (a fixed pool's only grows: its rows' pages stay mapped)."""
        return self.resident_bytes if self.fixed else self._peak

    def reserve(self, n: int) -> None:
        """Room for positions [0, n) in every row."""
        if n > self.S:
            if n > self.buckets[-1]:
                raise ValueError(f"{n} positions exceed the pool's capacity {self.buckets[-1]}")
            self._resize(next(b for b in self.buckets if b >= n))

    def shrink(self, need: int) -> None:
        """Move to a smaller bucket when every row fits in half of it or less (hysteresis: no back and forth)."""
        b = next((b for b in self.buckets if b >= 2 * max(need, 1)), self.buckets[-1])
        if not self.fixed and b < self.S:
            self._resize(b)

    def views(self, B: int, first: int = 0) -> list[np.ndarray]:
        """past_key.0, past_value.0, ...: zero-copy [B,Hkv,S,D] views of rows [first, first+B)."""
        L = self.data.shape[0]
        return [self.data[i, j, first:first + B] for i in range(L) for j in (0, 1)]

    def commit(self, r: int, new_kv: np.ndarray | None, b: int, rows) -> None:
        """Write new_kv[:, :, b] rows `rows` (indices into T) at row r's positions n[r], n[r]+1, ...; new_kv
        None: the call wrote its rows into row r's slots n[r].. in place (a fused graph), move them."""
        rows = np.asarray(rows, dtype=np.int64)
        m = len(rows)
        if m == 0:
            return
        n = int(self.n[r])
        if new_kv is None:
            moved = in_place(rows)
            if moved is not None:
                self.data[:, :, r, :, n + moved] = self.data[:, :, r, :, n + rows[moved]]
            self.n[r] = n + m
            self.high[r] = max(self.high[r], n + m)
            return
        self.reserve(n + m)
        # new_kv: [L,2,B,Hkv,T,D]; a contiguous slot range takes a slice (basic indexing, one copy)
        self.data[:, :, r, :, n:n + m, :] = new_kv[:, :, b][:, :, :, self._index(rows)]
        self.n[r] = n + m
        self.high[r] = max(self.high[r], n + m)

    def move(self, src: int, dst: int) -> None:
        """Move row src's committed slots to free row dst (the engine packs busy rows low, so that a call
        covers fewer rows) and free src."""
        self.free.remove(dst)
        self.copy_row(src, dst)
        self.release(src)

    def copy_row(self, src: int, dst: int) -> None:
        """Row src's committed slots into row dst, which then holds as many (its free-list place unchanged)."""
        n = int(self.n[src])
        self.data[:, :, dst, :, :n] = self.data[:, :, src, :, :n]
        self.n[dst], self.high[dst] = n, max(self.high[dst], n)

    def load_prefix(self, r: int, kv: np.ndarray, P: int) -> None:
        """Row r (just acquired) takes positions [0, P) from kv [L, 2, Hkv, >=P, D]; n[r] = P."""
        self.reserve(P)
        self.data[:, :, r, :, :P] = kv[:, :, :, :P]
        self.n[r], self.high[r] = P, max(self.high[r], P)

    def row(self, r: int) -> "PoolRow":
        return PoolRow(self, r)


class PoolRow(RingKV):
    """One pool row seen as a RingKV of batch 1 (prefill chunks run on it with the single-sequence step)."""

    def __init__(self, pool: KVPool, r: int):
        self.pool, self.r, self.scratch, self.buckets = pool, r, {}, pool.buckets
        self._gen, self._data = -1, None

    @property
    def data(self):
        if self._gen != self.pool.generation:  # one view object per pool buffer (bindings key on it)
            self._gen, self._data = self.pool.generation, self.pool.data[:, :, self.r:self.r + 1]
        return self._data

    S = property(lambda self: self.pool.S)
    _slot = property(lambda self: np.arange(self.pool.S))

    @property
    def n(self):
        return int(self.pool.n[self.r])

    @n.setter
    def n(self, v):
        self.pool.n[self.r] = v

    def reserve(self, n: int) -> None:
        self.pool.reserve(n)

    def commit(self, new_kv: np.ndarray, rows, count: int | None = None) -> None:
        rows = list(rows)[:count] if count is not None else rows
        self.pool.commit(self.r, new_kv, 0, rows)


class SharedPool(KVPool):
    """A self-draft's view of the target's pool (same layers, heads, buckets and layout): each row's committed
    slots are the target's, and the draft writes its proposals into the free slots after them, which the
    target's next call overwrites before it reads them. `n` here is the draft's own per row; `sync` sets it
    to the target's before a step's drafting. It never moves the target's committed lengths or rows."""

    def __init__(self, target: KVPool):
        self.target, self.free = target, []
        self.n = target.n.copy()
        self.high = np.zeros_like(target.n)
        self._scratch, self._gen = {}, target.generation

    data = property(lambda self: self.target.data)
    S = property(lambda self: self.target.S)
    buckets = property(lambda self: self.target.buckets)
    fixed = property(lambda self: self.target.fixed)
    rows = property(lambda self: self.target.rows)
    generation = property(lambda self: self.target.generation)

    @property
    def scratch(self) -> dict:
        """The draft backend's bindings of the target's buffer, dropped when the target reallocates it."""
        if self._gen != self.target.generation:
            self._scratch, self._gen = {}, self.target.generation
        return self._scratch

    def sync(self) -> None:
        self.n[:] = self.target.n

    def reserve(self, n: int) -> None:
        self.target.reserve(n)

    def shrink(self, need: int) -> None:
        pass

    def copy_row(self, src: int, dst: int) -> None:
        self.n[dst] = self.target.n[dst]

    def _not_here(self, *a):
        raise NotImplementedError("a SharedPool's rows are the target pool's: take, free and move them there")

    acquire = release = move = _not_here
    resident_bytes = peak_bytes = property(lambda self: 0)  # it holds no memory of its own


class SharedKV(RingKV):
    """A self-draft's view of the target's cache (same layers, heads and buckets): it reads the target's
    committed slots and writes its own proposals into the free slots after them, which the target's next
    call overwrites. It never moves the target's committed length; `n` here is the draft's own."""

    def __init__(self, target: RingKV):
        self.target, self.n, self.scratch, self.buckets = target, target.n, {}, target.buckets

    data = property(lambda self: self.target.data)
    S = property(lambda self: self.target.S)
    _slot = property(lambda self: self.target._slot)

    def reserve(self, n: int) -> None:
        self.target.reserve(n)
