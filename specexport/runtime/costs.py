"""What a target call costs: running averages of measured seconds per (B, T) call, and a prior for the
calls not measured yet. The one step-cost model of the runtime (the tree sizer, adaptive k and the engine's
choice of T per step all price calls here).

Prior for a call not measured yet: once calls of two or more sizes are measured, the least-squares line
seconds = a + b * rows through them (rows = B*T); before that, the cheapest measured call scaled by 1 + 0.05
per extra row (on 2-core CPUs one extra row of a SmolLM2 call costs 4-10% of a one-row call,
docs/benchmarks.md).
"""
from __future__ import annotations

import numpy as np

ROW = 0.05  # prior cost of one more row, relative to a one-row call


class StepCosts:
    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self.seen: dict = {}  # (B, T) -> seconds (exponential moving average)

    def update(self, B: int, T: int, seconds: float) -> None:
        old = self.seen.get((B, T))
        self.seen[(B, T)] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds

    def cost(self, B: int, T: int) -> float:
        c = self.seen.get((B, T))
        if c is not None:
            return c
        if not self.seen:
            return 1 + ROW * (B * T - 1)
        rows = np.array([b * t for b, t in self.seen], dtype=float)
        secs = np.array(list(self.seen.values()))
        if len(set(rows)) >= 2:  # calls of two or more sizes measured: a line through them, seconds = a + b * rows
            b, a = np.polyfit(rows, secs, 1)
            if b > 0 and a > 0:
                return a + b * B * T
        one = float(np.min(secs / (1 + ROW * (rows - 1))))  # a one-row call, estimated
        return one * (1 + ROW * (B * T - 1))

    def best(self, B: int, ts, expected) -> int:
        """The T of `ts` with the most expected tokens per second: expected(T) / cost(B, T)."""
        return max(ts, key=lambda T: expected(T) / self.cost(B, T))
