"""The time-to-first-token mode (`--ttft 60,200,800,1500`): the whole prefill of prompts of given lengths.

The prompts are cut from one token stream, the Spec-Bench question texts joined in file order and encoded with
the bundle's tokenizer (no chat template), each (round, length) from its own stretch of it: no prompt is a
prefix of another, so a peer that caches prompt prefixes across calls (OpenVINO GenAI's LLMPipeline does:
a 1,500-token prompt seen before came back in 0.06 s) prefills every prompt in full. Each method generates one
token from each prompt (its prefill plus the first token's choice); every (length, method) runs in turn, the
rotation starting at the next method each round, --repeats rounds of the whole grid, and the median is kept.
The first method is the reference whose first token the others are checked against, prompt by prompt.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Callable

from . import machine
from .config import BenchConfig, find_questions
from .peers import Methods
from .runner import runnable, spread, warm_up


def prompt_stream(pipe, qpath: Path, need: int) -> list[int]:
    """At least `need` token ids of the question texts joined in file order (ValueError if there are fewer)."""
    texts = [json.loads(x)["turns"][0] for x in qpath.read_text().splitlines() if x.strip()]
    ids: list[int] = []
    for t in texts:
        ids += pipe.encode(t + "\n\n")
        if len(ids) >= need:
            return ids
    raise ValueError(f"--ttft: {need} prompt tokens needed (64 for the warm-up, then every length once per round) "
                     f"but the questions at {qpath} hold only {len(ids)}: fewer or shorter lengths, or fewer --repeats")


def run_ttft(cfg: BenchConfig, log: Callable[[str], None] = print) -> tuple[list[dict], dict]:
    """-> (records: one per (length, method) with every round's seconds, run info)."""
    cfg = dataclasses.replace(cfg, max_new_tokens=1)
    qpath = find_questions(cfg.questions)
    meths = list(runnable(cfg, log))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    m = Methods(cfg)
    ids = prompt_stream(m.pipe, qpath, 64 + cfg.repeats * sum(cfg.ttft))
    cuts, at = {}, 64  # (round, length) -> its own stretch of the stream; the warm-up takes the first 64 ids
    for rnd in range(cfg.repeats):
        for n in cfg.ttft:
            cuts[(rnd, n)], at = ids[at:at + n], at + n
    cpu = machine.cpu()
    log(f"time to first token: prompts of {', '.join(map(str, cfg.ttft))} tokens x {len(meths)} methods, "
        f"{cfg.repeats} rounds; {machine.label()}")
    meths = warm_up(m, meths, ids[:64], log)
    secs: dict = {}
    first: dict = {}
    for rnd in range(cfg.repeats):
        for n in cfg.ttft:
            # each round starts the rotation at another method: the one that runs first after another
            # length measured up to 1.2-1.6x slower than in second place (2026-12-02, two bundles swapped)
            for meth in meths[rnd % len(meths):] + meths[:rnd % len(meths)]:
                toks, dt, _ = m.run(meth, cuts[(rnd, n)])
                secs.setdefault((n, meth), []).append(dt)
                first.setdefault((n, meth), []).append(toks[:1])
            log(f"[round {rnd + 1}/{cfg.repeats}] {n:5d} tokens: " + " ".join(
                f"{meth}={secs[(n, meth)][-1]:.3f}s" for meth in meths))
    records = []
    with open(out / "records.jsonl", "w") as f:
        for (n, meth), runs in secs.items():
            med = statistics.median(runs)
            r = {"prompt_tokens": n, "method": meth, "seconds": med, "seconds_runs": runs, "spread": spread(runs),
                 "prefill_tokens_per_s": n / med, "first_tokens": first[(n, meth)],
                 "same_first_token": first[(n, meth)] == first[(n, meths[0])],
                 "cpu": cpu["model"], "cpu_flags": " ".join(cpu["flags"])}
            records.append(r)
            f.write(json.dumps(r) + "\n")
    info = {"methods": meths, "skipped": [x for x in cfg.methods if x not in meths], "questions": str(qpath),
            "machine": cpu, "versions": machine.versions(), "peers": m.info}
    return records, info


def summarize_ttft(records: list[dict], cfg: BenchConfig, info: dict) -> str:
    from .report import header

    meths = list(dict.fromkeys(r["method"] for r in records))
    by = {(r["prompt_tokens"], r["method"]): r for r in records}
    lines = header(cfg, info) + [
        f"Time to first token (seconds, median of {cfg.repeats} rounds; prompt tokens / seconds in brackets); "
        f"'vs {meths[0]}' is its time over the method's (> 1: faster).", "",
        "| prompt tokens | " + " | ".join(meths) + " | " + " | ".join(f"{x} vs {meths[0]}" for x in meths[1:]) + " |",
        "|---" * (1 + 2 * len(meths) - 1) + "|"]
    for n in cfg.ttft:
        ref = by[(n, meths[0])]["seconds"]
        cells = [f"{by[(n, x)]['seconds']:.3f} ({n / by[(n, x)]['seconds']:.0f})" for x in meths]
        ratios = [f"{ref / by[(n, x)]['seconds']:.2f}x" + ("" if by[(n, x)]["same_first_token"] else " (other token)")
                  for x in meths[1:]]
        lines.append(f"| {n} | " + " | ".join(cells + ratios) + " |")
    noisy = [f"{r['method']} at {r['prompt_tokens']} ({r['spread']:.0%})" for r in records
             if r["spread"] > cfg.noise]
    if noisy:
        lines += ["", f"Rounds spread more than {cfg.noise:.0%}: " + ", ".join(noisy) + "."]
    return "\n".join(lines)
