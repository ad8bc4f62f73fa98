"""Prompt lookup (the ngram drafter): no model; the continuation of the latest earlier occurrence of the
context's last n tokens, proposed as a chain.
"""
from __future__ import annotations

import numpy as np

from .base import Choose, Proposal


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_n .. 1) and propose
    what followed it."""

    def __init__(self, max_n: int = 3):
        if max_n < 1:
            raise ValueError("ngram size must be >= 1")
        self.max_n = max_n

    def start(self, prompt: list[int], target_cache=None) -> float:
        return 0.0

    def propose(self, tokens: list[int], k: int, choose: Choose | None = None) -> Proposal:
        n, e = self.match(tokens)
        props = list(tokens[e + 1:e + 1 + k]) if n else []
        return Proposal(props, [None] * len(props))

    def match(self, tokens) -> tuple[int, int]:
        """(n, e): the longest n <= max_n for which the last n tokens occurred before, and where the latest such
        occurrence ends (its continuation starts at e + 1); (0, -1) when the last token is new."""
        arr = np.asarray(tokens)
        L = len(arr)
        # earlier positions e <= L-2 holding the last token, narrowed while the n-1 tokens before them match
        # too: the latest of the longest match; one pass over the sequence per step (it runs every step)
        ends = np.flatnonzero(arr[:L - 1] == arr[-1])
        if not len(ends):
            return 0, -1
        n = 1
        for m in range(2, min(self.max_n, L - 1) + 1):
            longer = ends[ends >= m - 1]
            longer = longer[arr[longer - (m - 1)] == arr[L - m]]
            if not len(longer):
                break
            ends, n = longer, m
        return n, int(ends[-1])

    def accepted(self, n_before: int, a: int, k: int) -> None:
        pass
