"""Memory over many generations with varied prompt lengths: does RSS stay flat after warm-up? (issue 16)

  python scripts/soak.py bundles/smollm2 --n 1000 --lengths 8-512 --max-new-tokens 16
  python scripts/soak.py BUNDLE --n 300 --ort default,no_mem_pattern,no_arena,shape_free   # which cache grows

One fresh process per (drafter, onnxruntime variant), so that each RSS curve starts from its own baseline.
Each generation: a prompt of random token ids (never an EOS) whose length is drawn from --lengths, greedy,
--max-new-tokens new tokens. VmRSS is sampled every --every generations. Per run it prints one JSON record
(rss_mb series, RSS after warm-up and at the end, growth per 100 generations after warm-up, distinct prompt
lengths) and a table at the end.

--ort rebuilds the pipeline's onnxruntime sessions with SessionOptions changed (the rest copied from the
runtime's own backend: threads, no spinning for a draft, ORT_ENABLE_ALL):
  default          the runtime's sessions as they are
  no_mem_pattern   enable_mem_pattern = False (no memory plan cached per input shape)
  no_arena         enable_cpu_mem_arena = False (every tensor from malloc)
  shape_free       both of the above
--trim calls malloc_trim(0) before each sample, to separate memory held by malloc from memory in use.
--populate maps the weight files' pages in at load (what onnxruntime reads in place from the file, e.g. the
embedding table, otherwise enters RSS page by page as new token ids are looked up: RssFile, not RssAnon).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import time

VARIANTS = {"default": {}, "no_mem_pattern": {"enable_mem_pattern": False},
            "no_arena": {"enable_cpu_mem_arena": False},
            "shape_free": {"enable_mem_pattern": False, "enable_cpu_mem_arena": False}}


def rss_mb(field: str = "VmRSS") -> float:
    """VmRSS, or RssAnon (malloc, arenas, prepacked weights) / RssFile (mapped files: weights read in place)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def populate(suffix: str = ".onnx.data") -> int:
    """Map in now every page of the weight files onnxruntime memory-mapped (madvise MADV_POPULATE_READ, Linux
    5.14+) -> MB. onnxruntime reads some external initializers in place from the file (the embedding table
    Gather reads): without this their pages enter RSS one by one as new token ids are looked up."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(suffix):
                a, b = (int(x, 16) for x in parts[0].split("-"))
                if libc.madvise(a, b - a, 22) == 0:  # 22 = MADV_POPULATE_READ
                    done += b - a
    return done >> 20


def lengths(spec: str) -> tuple[int, int]:
    a, _, b = spec.partition("-")
    return int(a), int(b or a)


def rebuild_sessions(pipe, variant: dict) -> None:
    """Replace each model's onnxruntime session by one with `variant`'s SessionOptions changed."""
    import onnxruntime as ort

    from specexport.backends.ort import session_options

    for be in (pipe.target, pipe.draft):
        if be is None or not hasattr(be, "session"):
            continue
        so = session_options()  # the process's shared thread pool, as the runtime's own sessions
        for k, v in variant.items():
            setattr(so, k, v)
        be.session = ort.InferenceSession(str(pipe.root / be.entry.graph), so, providers=["CPUExecutionProvider"])


def child(a) -> dict:
    import specexport

    pipe = specexport.load(a.bundle)
    rebuild_sessions(pipe, VARIANTS[a.ort])
    populated = populate() if a.populate else 0
    draft = None if a.draft == "default" else a.draft
    V = pipe.manifest.target.arch["vocab_size"]
    eos = set(pipe.manifest.tokenizer["eos_token_ids"])
    lo, hi = lengths(a.lengths)
    hi = min(hi, pipe.manifest.capacity - a.max_new_tokens - 1)
    rng = random.Random(a.seed)
    trim = ctypes.CDLL("libc.so.6").malloc_trim if a.trim else None
    series, anon, files, seen, t0 = [], [], [], set(), time.perf_counter()
    for i in range(a.n):
        L = rng.randint(lo, hi)
        seen.add(L)
        ids = [t for t in (rng.randrange(3, V) for _ in range(L + 8)) if t not in eos][:L]
        pipe.generate(ids, max_new_tokens=a.max_new_tokens, draft=draft, k=a.k)
        if (i + 1) % a.every == 0:
            if trim is not None:
                trim(0)
            series.append(round(rss_mb(), 1))
            anon.append(round(rss_mb("RssAnon"), 1))
            files.append(round(rss_mb("RssFile"), 1))
    warm = max(1, len(series) * a.warmup // a.n)  # samples inside the warm-up
    after = series[warm:]
    per100 = (after[-1] - after[0]) / ((len(after) - 1) * a.every) * 100 if len(after) > 1 else float("nan")
    return {"bundle": a.bundle, "draft": a.draft, "ort": a.ort, "n": a.n, "lengths": a.lengths,
            "distinct_lengths": len(seen), "max_new_tokens": a.max_new_tokens, "trim": a.trim,
            "rss_warm_mb": after[0] if after else None, "rss_end_mb": series[-1] if series else None,
            "growth_mb_per_100": round(per100, 2), "seconds": round(time.perf_counter() - t0, 1),
            "populated_mb": populated, "every": a.every, "rss_mb": series, "rss_anon_mb": anon, "rss_file_mb": files}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--n", type=int, default=1000, help="generations per run")
    p.add_argument("--drafts", default="model,ngram,recycle,none", help="comma-separated; 'default' = the bundle's")
    p.add_argument("--ort", default="default", help="comma-separated: " + ", ".join(VARIANTS))
    p.add_argument("--lengths", default="8-512", help="prompt lengths in tokens, LO-HI (capped by the capacity)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--k", default=None, help="draft length (default: the pipeline's)")
    p.add_argument("--every", type=int, default=25, help="sample RSS every this many generations")
    p.add_argument("--warmup", type=int, default=200, help="generations before the flat-after-warm-up window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trim", action="store_true", help="malloc_trim(0) before each sample")
    p.add_argument("--populate", action="store_true", help="map the weight files' pages in at load (see populate)")
    p.add_argument("--out", default=None, help="also append the JSON records to this file")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--draft", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.k is not None and a.k != "auto":
        a.k = int(a.k)
    if a.child:
        print(json.dumps(child(a)), flush=True)
        return 0
    records = []
    for ort_variant in a.ort.split(","):
        for draft in a.drafts.split(","):
            cmd = [sys.executable, __file__, a.bundle, "--child", "--draft", draft, "--ort", ort_variant,
                   "--n", str(a.n), "--lengths", a.lengths, "--max-new-tokens", str(a.max_new_tokens),
                   "--every", str(a.every), "--warmup", str(a.warmup), "--seed", str(a.seed)]
            cmd += ["--k", str(a.k)] if a.k is not None else []
            cmd += ["--trim"] if a.trim else []
            cmd += ["--populate"] if a.populate else []
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "ORT_DISABLE_TELEMETRY": "1"})
            if r.returncode != 0:
                print(f"{draft}/{ort_variant} failed: {r.stderr[-2000:]}", file=sys.stderr)
                continue
            rec = json.loads(r.stdout.strip().splitlines()[-1])
            records.append(rec)
            print(json.dumps(rec), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    print(f"\n| draft | onnxruntime | populate | RSS after {a.warmup} (MB) | RSS at {a.n} (MB) | MB per 100 "
          "generations | RssAnon / RssFile at the end (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        print(f"| {r['draft']} | {r['ort']} | {'yes' if r['populated_mb'] else 'no'} | {r['rss_warm_mb']} | "
              f"{r['rss_end_mb']} | {r['growth_mb_per_100']} | {r['rss_anon_mb'][-1]} / {r['rss_file_mb'][-1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
