"""What a target call costs: running averages of measured seconds per (B, T) call, and a prior for the
calls not measured yet. The one step-cost model of the runtime (the tree sizer, adaptive k and the engine's
choice of T per step all price calls here).

Prior: a call of B rows x T new tokens costs the cheapest measured call scaled by 1 + 0.05 per extra row
(B*T - 1): on 2-core CPUs one extra row of a SmolLM2 call costs 4-10% of a one-row call (docs/benchmarks.md).
"""
from __future__ import annotations

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
        one = min(s / (1 + ROW * (b * t - 1)) for (b, t), s in self.seen.items())  # a one-row call, estimated
        return one * (1 + ROW * (B * T - 1))

    def best(self, B: int, ts, expected) -> int:
        """The T of `ts` with the most expected tokens per second: expected(T) / cost(B, T)."""
        return max(ts, key=lambda T: expected(T) / self.cost(B, T))
