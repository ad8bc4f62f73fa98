"""Accept: which of the drafted tokens the target keeps, and its own next token. Pure functions of the
target's logits and the sampler (no models, no caches): a chain (draft model, prompt lookup) or a tree
(token recycling); greedy, Gumbel-max, or the rejection sampler.
"""
from __future__ import annotations

import numpy as np

from .drafters.base import Tree
from .sampling import SamplingParams, accept_rejection, gumbel_argmax, kept, probs, sample_from, warp


class Picker:
    """Chooses tokens for one generation: greedy argmax, Gumbel-max with per-position noise, or draws for
    the rejection sampler. The noise is a function of (seed, position, token), so draft and target see the
    same g_p without keeping it."""

    def __init__(self, sp: SamplingParams):
        self.sp = sp
        self.rng = np.random.default_rng(sp.seed)

    def target(self, logits: np.ndarray, pos: int) -> int:
        if self.sp.greedy:
            return int(np.argmax(logits))
        if self.sp.sampler == "gumbel":
            return gumbel_argmax(*kept(logits, self.sp), self.sp.seed, pos)
        return sample_from(probs(warp(logits, self.sp)), self.rng)

    def draft(self, logits: np.ndarray, pos: int) -> tuple[int, np.ndarray | None]:
        if self.sp.greedy or self.sp.sampler == "gumbel":
            return self.target(logits, pos), None
        q = probs(warp(logits, self.sp))
        return sample_from(q, self.rng), q


def accept(logits: np.ndarray, props: list[int], qs: list, pos0: int, pick: Picker) -> list[int]:
    """Tokens to emit after verifying `props`: logits [>=m+1, V], row i predicts position pos0+i."""
    out = []
    for i, d in enumerate(props):
        if pick.sp.greedy or pick.sp.sampler == "gumbel":
            t = pick.target(logits[i], pos0 + i)  # the target's own token; the draft only saved time
            out.append(t)
            if t != d:
                return out
        else:
            p = probs(warp(logits[i], pick.sp))
            q = qs[i] if qs[i] is not None else np.eye(1, len(p), d)[0]  # ngram: a point mass
            r = accept_rejection(p, q, d, pick.rng)
            out.append(d if r is None else r)
            if r is not None:
                return out
    out.append(pick.target(logits[len(props)], pos0 + len(props)))  # the bonus token
    return out


def check_finite(logits: np.ndarray, role: str) -> None:
    if not np.isfinite(logits).all():
        raise FloatingPointError(f"the {role} model produced NaN or inf logits; the bundle's graph or weights "
                                 "are broken: rebuild it and check its parity report")


def accept_tree(logits: np.ndarray, tree: Tree, T: int, N: int, pick) -> tuple[list[int], list[int]]:
    """Walk the tree from the root -> (emitted tokens, accepted node rows incl. the root)."""
    kids: list[dict] = [{} for _ in range(min(T, len(tree)))]
    for i in range(1, len(kids)):
        kids[tree.parent[i]][tree.tokens[i]] = i  # insertion order = best score first
    node, path, out = 0, [0], []
    while True:
        pos = N + tree.depth[node]
        if pick.sp.greedy or pick.sp.sampler == "gumbel":
            t = pick.target(logits[node], pos)
        else:  # multi-candidate rejection for point-mass drafts: exact
            p = probs(warp(logits[node], pick.sp))
            t = None
            for c in kids[node]:
                z = p.sum()
                if z > 0 and pick.rng.random() * z < p[c]:
                    t = c
                    break
                p[c] = 0.0
            if t is None:
                t = sample_from(p / p.sum(), pick.rng) if p.sum() > 0 else pick.target(logits[node], pos)
        out.append(t)
        nxt = kids[node].get(t)
        if nxt is None:
            return out, path
        node = nxt
        path.append(node)
