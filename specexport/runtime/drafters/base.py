"""What a drafter is. A drafter proposes; it never decides what is emitted (the target does, runtime/accept).

Two kinds, one decode step each (runtime/decoder: chain_step, tree_step):
- ChainDrafter (a draft model, prompt lookup): `propose` k tokens in a row, with the draft's distribution
  of each when it has one (None: a point mass); `accepted` says how many the target kept.
- TreeDrafter (token recycling): `draft` a Tree of candidate continuations verified in one call;
  `verified` learns from the call.
Every method that runs a model returns the seconds it spent inside it (the decode loop adds them up).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol, runtime_checkable

import numpy as np

# choose(logits_row [V], position) -> (token, q_row [V] or None)
Choose = Callable[[np.ndarray, int], tuple[int, "np.ndarray | None"]]


class Proposal(NamedTuple):
    tokens: list  # the drafted tokens d1..dk
    qs: list  # per token: the draft's distribution [V], or None (a point mass)
    seconds: float = 0.0  # inside the draft model's calls


@runtime_checkable
class ChainDrafter(Protocol):
    def start(self, prompt: list[int], target_cache) -> float: ...  # -> seconds of its own prefill

    def propose(self, tokens: list[int], k: int, choose: Choose) -> Proposal: ...

    def accepted(self, n_before: int, a: int, k: int) -> None: ...


@runtime_checkable
class TreeDrafter(Protocol):
    def draft(self, tokens: list[int], nodes: int, max_depth: int) -> "Tree": ...

    def verified(self, tree: "Tree", path: list[int], emitted: list[int], logits: np.ndarray,
                 top: np.ndarray | None = None) -> None: ...


@dataclass
class Tree:
    tokens: list  # node 0 is the root (the last committed token)
    parent: list
    depth: list
    score: list  # product of hit rates on the path: the estimated chance the node is accepted
    ctx: list  # per node: the last <= 3 tokens of its path (its key in the successor table)
    cands: list = field(default_factory=list)  # per expanded node: its candidate children [(kind, token)]

    def __len__(self) -> int:
        return len(self.tokens)

    def inputs(self, T: int, N: int):
        """ids, absolute positions and new_mask [1,T,T] for the first T nodes; a pad row sees itself only."""
        n = min(T, len(self))
        ids = self.tokens[:n] + [0] * (T - n)
        pos = np.array([N - 1 + d for d in self.depth[:n]] + [N - 1] * (T - n), dtype=np.int64)
        mask = np.eye(T, dtype=bool)
        for i in range(1, n):
            mask[i] |= mask[self.parent[i]]
        return ids, pos, mask[None]

    def path(self, nodes: list[int]) -> "Tree":
        """The tree cut to `nodes`, a path from the root (each node the parent of the next): a chain whose
        nodes keep their tokens, scores, contexts and candidate lists."""
        return Tree([self.tokens[i] for i in nodes], list(range(-1, len(nodes) - 1)), list(range(len(nodes))),
                    [self.score[i] for i in nodes], [self.ctx[i] for i in nodes],
                    [self.cands[i] if i < len(self.cands) else [] for i in nodes])

    @staticmethod
    def root(tokens: list[int]) -> "Tree":
        """Just the last committed token: a plain decode step."""
        return Tree([tokens[-1]], [-1], [0], [1.0], [tuple(tokens[-3:])], [[]])

    @staticmethod
    def chain(tokens: list[int], props: list[int], rate: float) -> "Tree":
        """A chain of drafted tokens as a tree, node i scored rate ** i."""
        n = len(props)
        return Tree([tokens[-1]] + list(props), list(range(-1, n)), list(range(n + 1)),
                    [rate ** i for i in range(n + 1)], [tuple(tokens[-3:])] * (n + 1), [[] for _ in range(n + 1)])
