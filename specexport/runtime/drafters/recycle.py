"""Tree drafting by token recycling (Luo et al. 2024, "Turning Trash into Treasure"), merged with prompt lookup.

Every verify call computes logits for each token it is fed; plain decoding keeps one row's argmax and throws
the rest away. Here the top-w successors of every verified token are kept in a table, succ[token] -> w candidate
next tokens (the target's own top-w the last time it saw that token, shared by all generations of a
Pipeline, as the paper keeps its matrix across queries). Each step drafts a tree from it:

- the root is the last committed token; a node's candidate children are succ[node] (ranks 0..w-1) and, on
  the prompt-lookup chain, the chain's next token (kind w);
- each candidate kind has a running hit rate (how often it was the target's token, measured on this
  generation), a node's score is the product of the hit rates on its path, and the tree is the best-scoring
  nodes, taken best first (so every prefix of the node list is a tree);
- how many nodes to verify is chosen per step among the built verify profiles: the T that maximises
  expected tokens per second, (1 + sum of node scores) / measured cost of a T-token target call.

The whole tree is verified in one target call: node i at position N-1+depth(i), new_mask = "is an ancestor
or itself". Acceptance walks from the root: the target picks its token at the node (argmax, Gumbel-max, or
a draw), and the walk moves to the child carrying that token, if there is one. Greedy and Gumbel picks are
the target's own tokens, so the output is the plain decode's; the rejection sampler uses the exact
multi-candidate rule for point-mass drafts (accept child c with p(c); otherwise zero p(c), renormalise,
try the next; sample the rest). Only the accepted path's K/V rows are committed.
"""
from __future__ import annotations

import heapq

import numpy as np

from .base import Tree
from .ngram import NgramDrafter


class SuccessorTable:
    """The target's top-w next tokens after a context, most likely first, for contexts of the last 1, 2 and 3
    tokens (the longest seen context is the most specific; measured on Spec-Bench output of SmolLM2: the
    top-1 successor is right 30% of the time after 1 token, 48% after 2, 55% after 3, where those were seen)."""

    ORDERS = 3

    def __init__(self, vocab: int, width: int = 8, max_entries: int = 1 << 17):
        # max_entries bounds the 2- and 3-token contexts (~250 bytes each: ~33 MB), about 10k verify steps
        self.width, self.max_entries = width, max_entries
        self.succ = np.full((vocab, width), -1, dtype=np.int64)  # order 1, a dense table
        self.ctx: dict = {}  # (t1, t2) or (t1, t2, t3) -> top-w tuple

    def observe(self, contexts: list, logits: np.ndarray, top: np.ndarray | None = None) -> None:
        """Row i of logits [n,V] predicts what follows contexts[i] (a tuple of the last <= 3 tokens); `top`
        [>=n,>=w]: the call's token ids by decreasing logit per row, when the graph computed them (pad rows
        past n are ignored)."""
        if top is not None and top.shape[1] >= self.width:
            top = top[:len(contexts), :self.width]
        else:
            x = np.array(logits[:len(contexts)], dtype=np.float32)
            rows = np.arange(len(x))
            top = np.empty((len(x), self.width), dtype=np.int64)
            for j in range(self.width):  # w argmax passes: ~10x faster than argpartition over 49k columns
                top[:, j] = i = x.argmax(axis=1)
                x[rows, i] = -np.inf
        self.succ[[c[-1] for c in contexts]] = top
        if len(self.ctx) > self.max_entries:  # a long-lived pipeline: start over rather than grow forever
            self.ctx.clear()
        for c, t in zip(contexts, map(tuple, top.tolist())):
            for n in range(2, min(len(c), self.ORDERS) + 1):
                self.ctx[c[-n:]] = t

    def copy(self) -> "SuccessorTable":
        t = SuccessorTable(self.succ.shape[0], self.width, self.max_entries)
        t.succ[:] = self.succ
        t.ctx = dict(self.ctx)  # its values are tuples: shared, never changed in place
        return t

    def to_array(self) -> np.ndarray:
        """The table as int32 rows [context (3 tokens, -1 before a shorter one), top-w]: the order-1 rows that
        hold something, then the longer contexts (`from_array` reads it back)."""
        w, rows = self.width, np.flatnonzero(self.succ[:, 0] >= 0)
        one = np.concatenate([np.full((len(rows), 2), -1), rows[:, None], self.succ[rows]], axis=1)
        more = [(-1,) * (3 - len(c)) + c + t for c, t in self.ctx.items()]
        return np.concatenate([one, np.array(more, dtype=np.int64).reshape(-1, 3 + w)]).astype(np.int32)

    @classmethod
    def from_array(cls, a: np.ndarray, vocab: int) -> "SuccessorTable":
        """A table from `to_array`'s rows; ValueError naming what is wrong with rows that are not such a table
        (a bundle's file is untrusted input)."""
        if a.dtype != np.int32 or a.ndim != 2 or a.shape[1] <= 3:
            raise ValueError(f"must be int32 rows of 3 context tokens + successors, got {a.dtype} {a.shape}")
        t = cls(vocab, width=a.shape[1] - 3)
        if not 1 <= t.width <= 64 or len(a) > vocab + t.max_entries:
            raise ValueError(f"{a.shape[1] - 3} successors per row or {len(a)} rows is out of range "
                             f"(1..64, at most {vocab + t.max_entries})")
        if a.size and (a.min() < -1 or a.max() >= vocab):
            raise ValueError(f"token ids must lie in [-1, {vocab}), found {a.min()}..{a.max()}")
        key, top = a[:, :3], a[:, 3:]
        n = (key >= 0).sum(axis=1)  # context length: -1s come first, then 1-3 tokens
        if ((key >= 0) != (np.arange(3) >= 3 - n[:, None])).any() or (n == 0).any():
            raise ValueError("a context must be 1-3 token ids after its -1 padding")
        one = n == 1
        t.succ[key[one, 2]] = top[one]
        t.ctx = {tuple(k[3 - m:]): tuple(v) for k, v, m in zip(key[~one].tolist(), top[~one].tolist(), n[~one])}
        return t

    def candidates(self, context: tuple, limit: int = 0) -> list:
        """[(kind, token)]: longest context first; kind = (order - 1) * w + rank; a token only once; at most
        `limit` (0 = all)."""
        out, seen = [], set()
        for n in range(min(len(context), self.ORDERS), 0, -1):
            c = self.ctx.get(context[-n:]) if n > 1 else self.succ[context[-1]].tolist()
            for r, t in enumerate(c or ()):
                if t >= 0 and t not in seen:
                    seen.add(t)
                    out.append(((n - 1) * self.width + r, t))
        return out[:limit] if limit else out


class RecycleDrafter:
    """A TreeDrafter: drafting runs no model."""

    def __init__(self, table: SuccessorTable, max_n: int = 3, decay: float = 0.95, limit: int = 8,
                 chain: bool = False):
        # limit: candidate children per node, longest context first (13 Spec-Bench questions: tau 1.59 with 8
        # against 1.55 with all ~24, same host time; learning only from the accepted path lost: tau 1.49)
        self.table, self.decay, self.limit = table, decay, limit
        # chain: draft the tree's best path only (a target whose tree verify rows do not score exactly as its
        # decode rows, where a chain's do: int8 activations with a pad token, OpenVINO in bfloat16)
        self.chain = chain
        self.lookup = NgramDrafter(max_n)
        w = table.width
        self.lookup_kind = SuccessorTable.ORDERS * w  # the prompt-lookup child's kind; table kinds are below it
        prior = [0.4 / (r + 1) * (1 + 0.3 * o) for o in range(SuccessorTable.ORDERS) for r in range(w)] + [0.3]
        self.hits = np.array(prior) * 4  # prior rates, weight 4 trials
        self.trials = np.full(len(prior), 4.0)

    def draft(self, tokens: list[int], nodes: int, max_depth: int) -> Tree:
        """The best `nodes` + 1 nodes (root included) at depth <= max_depth; with `chain`, the best path of a
        tree of 4x as many nodes, cut to `nodes` + 1 (from the root, each step to the highest-scored child)."""
        if not self.chain:
            return self._tree(tokens, nodes, max_depth)
        tree = self._tree(tokens, 4 * nodes, min(max_depth, nodes))
        path = [0]
        while len(path) <= nodes:
            kids = [i for i in range(path[-1] + 1, len(tree)) if tree.parent[i] == path[-1]]
            if not kids:
                break
            path.append(max(kids, key=lambda i: tree.score[i]))
        return tree.path(path)

    def _tree(self, tokens: list[int], nodes: int, max_depth: int) -> Tree:
        rate = self.hits / self.trials
        chain = self.lookup.propose(tokens, max_depth).tokens if max_depth > 0 else []
        n = SuccessorTable.ORDERS
        tree = Tree([tokens[-1]], [-1], [0], [1.0], [tuple(tokens[-n:])])
        on_chain = [0 if chain else None]  # index into chain of the node's lookup child
        heap: list = []
        where: dict = {}  # (parent, token) -> node

        def expand(i):
            c = self.table.candidates(tree.ctx[i], self.limit)
            k = on_chain[i]
            if k is not None and k < len(chain):
                c.append((self.lookup_kind, chain[k]))
            tree.cands.append(c)
            if tree.depth[i] < max_depth:
                for kind, t in c:
                    heapq.heappush(heap, (-tree.score[i] * rate[kind], i, kind, t))

        expand(0)
        while heap and len(tree) <= nodes:
            s, i, kind, t = heapq.heappop(heap)
            j = where.get((i, t))
            if j is not None:  # lookup and the table proposed the same child: keep one, let it follow the chain
                if kind == self.lookup_kind and on_chain[j] is None:
                    on_chain[j] = on_chain[i] + 1
                    if on_chain[j] < len(chain):
                        tree.cands[j].append((self.lookup_kind, chain[on_chain[j]]))
                        if tree.depth[j] < max_depth:
                            heapq.heappush(heap, (-tree.score[j] * rate[kind], j, kind, chain[on_chain[j]]))
                continue
            where[(i, t)] = len(tree)
            tree.tokens.append(t)
            tree.parent.append(i)
            tree.depth.append(tree.depth[i] + 1)
            tree.score.append(-s)
            tree.ctx.append((tree.ctx[i] + (t,))[-n:])
            on_chain.append(on_chain[i] + 1 if kind == self.lookup_kind else None)
            expand(len(tree) - 1)
        return tree

    def verified(self, tree: Tree, path: list[int], emitted: list[int], logits: np.ndarray,
                 top: np.ndarray | None = None) -> None:
        """Learn from one verify call: hit rates along the accepted path, successors of every fed node."""
        self.hits *= self.decay
        self.trials *= self.decay
        for node, tok in zip(path, emitted):  # the target's token after path node i is emitted[i]
            for kind, t in tree.cands[node]:
                self.trials[kind] += 1
                self.hits[kind] += t == tok
        self.table.observe(tree.ctx[:len(logits)], logits, top)
