"""The recycle drafter's successor table, seeded at build time from the target's own output.

Token recycling learns its table (runtime/drafters/recycle.py) from every verify call, and a pipeline keeps it
across requests, so a service's first requests draft from an empty table: a third of the first steps draft
nothing. The build runs the bundle it just wrote (the runtime, the target as shipped, recycle drafting) on the
generic prompts below, written for this purpose (none is from a benchmark), and stores the table it learnt;
every pipeline then starts from a copy (`Pipeline.fresh_table`). Measured on SmolLM2 (docs/benchmarks.md
"A seeded successor table"). It changes which drafts are tried, never what is emitted.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

FILE = "successors.npy"
PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten-year-old.",
    "What are the main causes of inflation? Give three and explain each briefly.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and an example.",
    "Summarize the plot of a typical detective novel in one paragraph.",
    "Translate into French: 'The weather is nice today, so we are going to the park after lunch.'",
    "A train travels 120 km in 1.5 hours. What is its average speed? Show your steps.",
    "List five tips for writing a clear email to a colleague.",
    "Compare renewable and fossil energy sources in a short table with pros and cons.",
    "Write a polite reply declining an invitation to a meeting next Tuesday.",
    "What is the difference between a list and a tuple in Python?",
    "Describe the water cycle step by step.",
    "Give a recipe for a simple tomato pasta sauce.",
    "Explain what a binary search does and how fast it is.",
    "Write a haiku about autumn leaves, then explain its imagery.",
    "If I have 3 apples and buy 2 dozen more, then give away a third, how many do I have?",
)


def seed(root: Path, tokens: int, log) -> dict:
    """Generate up to `tokens` new tokens for each prompt with the bundle at `root` (its manifest written, the
    files not yet sealed), write the table to root/FILE -> the manifest's `successors` entry."""
    from ..runtime.pipeline import Pipeline

    t = time.perf_counter()
    pipe = Pipeline(root, verify=False)
    used, made = learn(pipe, tokens)
    np.save(root / FILE, pipe.successors.to_array(), allow_pickle=False)
    log(f"  successor table seeded: {used} prompts, {made} tokens, {len(pipe.successors.ctx)} contexts "
        f"({time.perf_counter() - t:.1f} s)")
    return {"file": FILE, "prompts": used, "tokens": made}


def learn(pipe, tokens: int) -> tuple[int, int]:
    """Generate on PROMPTS with `pipe` (greedy, recycle drafting: its table learns) -> (prompts, tokens) made.
    The largest k, not the adaptive one: every step feeds the most nodes, and the tree sizes do not follow
    measured call times (the prefill's chunking still does, so two runs learn nearly, not exactly, the same
    table: tests/test_build.py)."""
    chat = bool(pipe.manifest.tokenizer.get("chat_template"))
    k = max(pipe.manifest.target.verify_ks())
    room = pipe.manifest.capacity - k - 2
    made = used = 0
    for p in PROMPTS:
        ids = pipe.encode(p, chat=chat)
        n = min(tokens, room - len(ids))
        if n < 1:
            continue  # a capacity too small for this prompt (test bundles)
        made += pipe.generate(ids, max_new_tokens=n, draft="recycle", k=k).stats.new_tokens
        used += 1
    return used, made
