"""Drafters: who proposes the next tokens (base.py says what a drafter is). One file per drafter:
model.py (a draft model of the bundle), ngram.py (prompt lookup), recycle.py (token recycling + prompt
lookup, a tree per step)."""
from .base import ChainDrafter, Proposal, Tree, TreeDrafter
from .model import Doubt, ModelDrafter, PoolDrafts, RowDraft, shares_cache, shares_pool
from .ngram import NgramDrafter
from .recycle import RecycleDrafter, SuccessorTable

__all__ = ["ChainDrafter", "Doubt", "ModelDrafter", "NgramDrafter", "PoolDrafts", "Proposal", "RecycleDrafter",
           "RowDraft", "SuccessorTable", "Tree", "TreeDrafter", "shares_cache", "shares_pool"]
