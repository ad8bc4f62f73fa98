"""Mutate a bundle's manifest many ways and load each: every mutation must raise BundleError naming the field,
or load and then generate (and `specexport inspect` it) without error. Any other exception is a bug.

  python scripts/fuzz_bundle.py BUNDLE --n 100000 --seed 0          # the long run (docs/design.md, Trust model)
  python scripts/fuzz_bundle.py BUNDLE --n 2000 --full 200           # load + generate only 200 accepted ones

The bundle's files are hard-linked (or copied) into a scratch directory once; only manifest.json changes.
tests/test_bundle_trust.py runs a few thousand of these with a fixed seed. Prints a summary line and the
first failures (seed, mutation, exception) as JSON; exit status 1 if any.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from specexport import bundle
from specexport.errors import BundleError

STRINGS = ["", "x", "..", "../x", "../../etc/passwd", "/etc/passwd", "/dev/zero", "./target.onnx", "a/../b",
           "target.onnx", "draft.onnx", "target.onnx.data", "tokenizer/tokenizer.json", "manifest.json", "tokenizer",
           "x" * 5000, "\u00e9\u4e2d", "\x00", "verify_4", "decode", "fused", "portable", "int4", "B", "T", "S",
           "float32", "int64", "{{ messages }}", "a\\b", "0" * 64, "f" * 64]
SCALARS = [None, True, False, 0, 1, -1, 2, 3, 5, 7, 8, 16, 95, 96, 97, 128, 2 ** 31, 2 ** 40, 2 ** 63, -2 ** 63,
           0.5, -0.0, 1e-9, 1e308, math.nan, math.inf, -math.inf]


def nodes(d, path=()):
    """Every (path, value) in a JSON tree, the root included."""
    yield path, d
    if isinstance(d, dict):
        for k, v in d.items():
            yield from nodes(v, path + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from nodes(v, path + (i,))


def get(d, path):
    for p in path:
        d = d[p]
    return d


def random_value(rng: random.Random, tree):
    r = rng.random()
    if r < 0.35:
        return rng.choice(SCALARS)
    if r < 0.6:
        return rng.choice(STRINGS)
    if r < 0.7:
        return rng.choice([[], [1], [1, 2], ["x"], [None], {}, {"a": 1}, {"decode": 1}])
    if r < 0.8:
        deep = 0
        for _ in range(rng.choice([5, 40, 200])):
            deep = [deep]
        return deep
    return copy.deepcopy(rng.choice([v for _, v in nodes(tree)][1:]))  # a value from elsewhere in the manifest


def mutate(rng: random.Random, d: dict) -> tuple[object, str, list]:
    """-> (a mutated copy of manifest d, or raw text/bytes for whole-file mutations; what was done; the paths
    changed)."""
    r = rng.random()
    if r < 0.03:  # the file as a whole
        text = json.dumps(d)
        kind = rng.choice(["truncate", "list", "string", "number", "deep", "bytes", "empty", "huge"])
        raw = {"truncate": text[:rng.randrange(len(text))], "list": "[1, 2]", "string": '"x"', "number": "1",
               "deep": "[" * 100000 + "]" * 100000, "bytes": b"\xff\xfe" + text.encode(), "empty": "",
               "huge": '{"x": "' + "a" * (bundle.MAX_MANIFEST_BYTES + 10) + '"}'}[kind]
        return raw, f"file:{kind}", []
    m, done, paths_changed = copy.deepcopy(d), [], []
    for _ in range(1 if rng.random() < 0.8 else rng.randint(2, 4)):
        paths = [p for p, _ in nodes(m)][1:]
        path = rng.choice(paths)
        parent, key = get(m, path[:-1]), path[-1]
        old = parent[key]
        op = rng.random()
        if op < 0.2:
            del parent[key]
            what = "delete"
        elif op < 0.3 and isinstance(parent, dict):
            new_key = rng.choice(["extra", "x", "../y", "verify_9", "messages"])
            parent[new_key] = random_value(rng, m)
            what, path = f"add {new_key} beside", path[:-1] + (new_key,)
        elif op < 0.5 and type(old) in (int, float):
            parent[key] = rng.choice([old + 1, old - 1, old * 2, -old, 0, old // 2 if type(old) is int else old / 2])
            what = "tweak number"
        elif op < 0.6 and isinstance(old, str):
            parent[key] = rng.choice(["../" + old, "/" + old, old + "x", old.upper(), old[:-1], old + "/", "./" + old])
            what = "tweak string"
        elif op < 0.65 and isinstance(old, list) and old:
            parent[key] = rng.choice([old[::-1], old + old[-1:], old[1:], old[:-1]])
            what = "tweak list"
        elif op < 0.7 and isinstance(parent, dict) and len(parent) > 1:
            other = rng.choice([k for k in parent if k != key])
            parent[key], parent[other] = parent[other], parent[key]
            what = f"swap with {other}"
            paths_changed.append(path[:-1] + (other,))
        else:
            parent[key] = random_value(rng, m)
            what = "replace"
        done.append(f"{what} {'.'.join(map(str, path))}")
        paths_changed.append(path)
    return m, "; ".join(done), paths_changed


def write(root: Path, doc) -> None:
    p = root / bundle.MANIFEST
    if isinstance(doc, bytes):
        p.write_bytes(doc)
    elif isinstance(doc, str):
        p.write_text(doc)
    else:
        p.write_text(json.dumps(doc))


def scratch_copy(src: Path, dst: Path) -> Path:
    """dst: src's files hard-linked (copied where links fail), the manifest a private copy."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)
    shutil.copytree(src, dst, copy_function=link)
    (dst / bundle.MANIFEST).unlink()
    shutil.copy2(src / bundle.MANIFEST, dst / bundle.MANIFEST)
    return dst


def names_field(msg: str, paths: list) -> bool:
    """Does a refusal name what was changed: a key on one of the changed paths, or the file a key names?"""
    words = {str(p) for path in paths for p in path if isinstance(p, str)}
    return any(w in msg for w in words)


def run(src: Path, n: int, seed: int, full: int | None = None, log=print, unnamed: list | None = None) -> dict:
    """n mutations of src's manifest; load + generate the first `full` accepted ones (all if None)."""
    from specexport.runtime import Pipeline

    original = json.loads((src / bundle.MANIFEST).read_text())
    rng = random.Random(seed)
    counts = {"refused_read": 0, "refused_load": 0, "unnamed": 0, "accepted": 0, "generated": 0}
    failures = []
    seen = set()
    with tempfile.TemporaryDirectory() as tmp:
        root = scratch_copy(src, Path(tmp) / "b")
        for i in range(n):
            doc, what, changed = mutate(rng, original)
            write(root, doc)
            stage = "read"
            try:
                m = bundle.read(root)
                counts["accepted"] += 1
                stage = "inspect"
                bundle.describe(m, root)
                key = json.dumps(doc, sort_keys=True, default=str)
                if (full is None or counts["generated"] < full) and key not in seen:
                    seen.add(key)
                    stage = "load"
                    pipe = Pipeline(root)
                    stage = "generate"
                    draft = ["model", "ngram", "recycle", "none", None][i % 5]
                    if draft == "model" and pipe.draft is None:
                        draft = None
                    pipe.generate("hello world hello", max_new_tokens=6, draft=draft)
                    counts["generated"] += 1
            except BundleError as e:
                if stage in ("read", "load"):
                    counts["refused_" + stage] += 1
                    msg = str(e)
                    if "\n" in msg or not msg:
                        failures.append({"i": i, "mutation": what, "stage": stage, "error": "multi-line: " + msg})
                    elif stage == "read" and changed and not names_field(msg, changed):
                        counts["unnamed"] += 1
                        if unnamed is not None and len(unnamed) < 50:
                            unnamed.append((what, msg))
                else:
                    failures.append({"i": i, "mutation": what, "stage": stage, "error": f"BundleError after load: {e}"})
            except Exception as e:  # noqa: BLE001 - anything else is what this script looks for
                failures.append({"i": i, "mutation": what, "stage": stage,
                                 "error": f"{type(e).__name__}: {e}"[:500],
                                 "where": traceback.format_exc(limit=-3)[-1500:]})
            if log and (i + 1) % 5000 == 0:
                log(f"{i + 1} mutations: {counts}, {len(failures)} failures")
    return {"seed": seed, "n": n, **counts, "failures": failures}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--n", type=int, default=100000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--full", type=int, default=None, help="load + generate at most this many accepted mutations")
    a = p.parse_args(argv)
    t = time.perf_counter()
    r = run(a.bundle, a.n, a.seed, a.full)
    print(json.dumps({k: v for k, v in r.items() if k != "failures"}) + f"  ({time.perf_counter() - t:.0f} s)")
    for f in r["failures"][:20]:
        print(json.dumps(f))
    return 1 if r["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
