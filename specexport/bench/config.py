"""`specexport bench` options: one frozen dataclass validated before any work, the method names, and where
the Spec-Bench questions are found. No model is loaded here and nothing optional is imported."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..runtime import SamplingParams, validate
from ..runtime.prefix import DEFAULT_MB

# the per-question mode's default: every peer that is installed here and our main methods (a peer that is not
# installed, or whose converted model is missing, is skipped with one line saying how to get it)
DEFAULT_METHODS = ("hf", "hf-pld", "ortgenai", "ov", "ov-pld", "se-none", "se-ngram-k4", "se-recycle-k4",
                   "se-recycle-k8", "se-model-k2", "llamacpp")
# --concurrency: plain batched decoding, fixed-k speculation, the adaptive choice, OpenVINO's continuous batching
DEFAULT_LOAD_METHODS = ("se-none", "se-ngram-k4", "se-recycle-k4", "se-recycle-kauto", "ov-cb", "ov-cb-pld")

SE = re.compile(r"^se-(none|ngram|model|recycle)(?:-k(\d+|auto))?(?:@(\w[\w.-]*))?$")
OV = re.compile(r"^ov(-cb)?(-int4)?(-default)?(-pld)?$")  # continuous batching, int4 IR, its own precision, lookup
PEERS = ("hf", "hf-pld", "hf-assist-int8", "ortgenai", "llamacpp", "llamacpp-pld")

Arrival = Literal["burst", "poisson"]


def parse_se(method: str) -> tuple[str, int | str | None, str]:
    """'se-recycle-k8@a8' -> ('recycle', 8, 'a8'); k is None when the name gives none, 'auto' for kauto."""
    m = SE.match(method)
    if not m:
        raise ValueError(f"not a specexport method: {method!r}")
    draft, k, tag = m.groups()
    return draft, (None if k is None else k if k == "auto" else int(k)), tag or ""


def check_method(method: str, load: bool) -> None:
    """Refuse a method name that does not exist in this mode, with the names that do."""
    se, ov = SE.match(method), OV.match(method)
    if load:
        if se or (ov and ov.group(1)):
            return
        raise ValueError(f"method {method!r} does not run under --concurrency: use se-none, se-ngram-kK, "
                         "se-model-kK, se-recycle-kK, se-recycle-kauto or ov-cb[-int4][-default][-pld]")
    if se or method in PEERS or (ov and not ov.group(1)):
        return
    hint = " (ov-cb* runs under --concurrency only)" if ov else ""
    raise ValueError(f"unknown method {method!r}{hint}: use {', '.join(PEERS)}, ov[-int4][-default][-pld], "
                     "se-none, se-ngram-kK, se-model-kK, se-recycle-kK (K a number or auto), se-...@TAG")


@dataclass(frozen=True)
class BenchConfig:
    bundle: str
    questions: str | None = None  # None: find_questions() finds Spec-Bench next to the repository
    out: str = "bench_out"
    per_category: int = 4
    limit: int | None = None  # at most this many questions in all, round-robin over the categories
    max_new_tokens: int = 128
    methods: tuple = DEFAULT_METHODS
    threads: int = 2
    repeats: int = 1  # runs of each (question, method); the median is kept and the spread checked
    noise: float = 0.10  # warn when a sample's repeats spread more than this fraction of their median
    ortgenai_model: str = "models/ortgenai-smollm2-fp32"
    gguf: str = "models/smollm2-135m.gguf"
    ov_model: str = "models/ov-smollm2-fp32"  # OpenVINO IR (optimum-cli export openvino --weight-format fp32)
    ov_int4_model: str = "models/ov-smollm2-int4"  # ... --weight-format int4 --sym --group-size 32
    extra_bundles: tuple = ()  # ("TAG=PATH", "TAG=PATH:BACKEND", ...) for se-...@TAG methods
    temperature: float = 0.0  # 0: greedy; else every method samples (top_p, seed)
    top_p: float = 1.0
    seed: int = 0
    concurrency: tuple = ()  # () : one request at a time, every method per question; else the load mode's levels
    arrival: Arrival = "burst"
    rate: float | None = None  # requests per second of the Poisson arrivals
    requests: int | None = None  # requests per level (default: every selected question, at least the level)
    prefill_budget: int | None = None  # the engine's prompt tokens per iteration while others decode (None: its default)
    prefix_cache_mb: float = DEFAULT_MB  # the engine's prefix cache (0: off); OpenVINO CB's prefix caching on where > 0
    ttft: tuple = ()  # () : not the time-to-first-token mode; else the prompt lengths it times

    def __post_init__(self):
        SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)  # the runtime's own checks
        if self.per_category < 1 or self.max_new_tokens < 1:
            raise ValueError("--per-category and --max-new-tokens must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit must be >= 1, got {self.limit}")
        if self.repeats < 1 or not 0 <= self.noise:
            raise ValueError("--repeats must be >= 1 and --noise >= 0")
        if any(not isinstance(c, int) or c < 1 for c in self.concurrency):
            raise ValueError(f"--concurrency takes integers >= 1, got {list(self.concurrency)}")
        if self.arrival not in ("burst", "poisson"):
            raise ValueError(f"--arrival must be burst or poisson, got {self.arrival!r}")
        if self.arrival == "poisson" and not (self.rate and self.rate > 0):
            raise ValueError("--arrival poisson needs --rate R (requests per second, > 0)")
        validate.prefix_cache_mb(self.prefix_cache_mb)  # the engine's own check
        if self.prefill_budget is not None and self.prefill_budget < 1:
            raise ValueError(f"--prefill-budget must be >= 1, got {self.prefill_budget}")
        if any(not isinstance(n, int) or n < 2 for n in self.ttft):
            raise ValueError(f"--ttft takes prompt lengths >= 2 tokens, got {list(self.ttft)}")
        if self.ttft and self.concurrency:
            raise ValueError("--ttft and --concurrency are separate modes: give one of them")
        if self.requests is not None and self.requests < 1:
            raise ValueError(f"--requests must be >= 1, got {self.requests}")
        for spec in self.extra_bundles:
            tag, path, _ = extra_bundle(spec)
            if not tag or not path:
                raise ValueError(f"--extra-bundle takes TAG=PATH or TAG=PATH:BACKEND, got {spec!r}")
        tags = {s.partition("=")[0] for s in self.extra_bundles}
        for m in self.methods:
            check_method(m, load=bool(self.concurrency))
            tag = m.partition("@")[2]
            if tag and tag not in tags:
                raise ValueError(f"method {m}: no bundle tagged {tag!r}; pass --extra-bundle {tag}=PATH")


def extra_bundle(spec: str) -> tuple[str, str, str]:
    """"TAG=PATH" or "TAG=PATH:BACKEND" (a backend of specexport.load, e.g. openvino-bf16) -> (tag, path, backend)."""
    from ..backends import KINDS

    tag, _, path = spec.partition("=")
    head, _, kind = path.rpartition(":")
    return (tag, head, kind) if head and kind in KINDS else (tag, path, "onnxruntime")


def find_questions(path: str | None = None) -> Path:
    """Spec-Bench's question.jsonl: `path` if given, else $SPECBENCH, else shared/specbench/ beside or inside
    the repository this package sits in. Never relative to the current directory."""
    if path:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no Spec-Bench questions at {p}")
        return p
    repo = Path(__file__).resolve().parents[2]
    tried = ([Path(os.environ["SPECBENCH"])] if os.environ.get("SPECBENCH") else []) + [
        repo.parent / "shared" / "specbench" / "question.jsonl", repo / "shared" / "specbench" / "question.jsonl"]
    for p in tried:
        if p.is_file():
            return p
    raise FileNotFoundError("no Spec-Bench question.jsonl found (tried " + ", ".join(map(str, tried)) +
                            "): pass --questions PATH or set SPECBENCH")


def questions(path: str | Path, per_category: int, limit: int | None = None) -> list[dict]:
    """The first `per_category` questions of each category, in file order; with `limit`, at most that many,
    taken round-robin over the categories (the first of each, then the second, ...)."""
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    rank, seen = {}, {}
    for i, r in enumerate(rows):
        n = seen.get(r["category"], 0)
        if n < per_category:
            seen[r["category"]] = n + 1
            rank[i] = n
    cats = list(dict.fromkeys(rows[i]["category"] for i in rank))
    keep = sorted(rank, key=lambda i: (rank[i], cats.index(rows[i]["category"])))[:limit]
    return [rows[i] for i in sorted(keep)]
