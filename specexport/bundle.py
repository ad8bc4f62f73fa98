"""The contract between exporter and runtime: manifest.json <-> frozen dataclasses, and the whole check of a
bundle before anything in it is opened.

Pure Python (no numpy, no torch, no onnxruntime). A bundle directory holds manifest.json, one ONNX graph and
one weights file per model, and the tokenizer files: exactly the files the manifest lists, nothing else.
A bundle is untrusted input (bundles travel between machines), so `read`, before any file is parsed:
- checks the manifest whole (`check`: types, ranges, required keys, the arch numbers against the graph I/O,
  profiles, buckets, capacity, batch sizes), read with a size and nesting limit;
- checks every path: a plain relative path (no `..`, no absolute path) to a regular file inside the bundle
  (no symlink, FIFO or device anywhere in it), every graph, weights, engine and tokenizer file listed;
- checks each file's size against the recorded size and its sha256 (bounded reads).
Every refusal is a BundleError naming the field. What this cannot promise (a graph is code for onnxruntime)
is in docs/design.md ("Trust model"). Opening graphs and the tokenizer is the runtime's (runtime/validate.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

from .errors import BundleError  # noqa: F401  (re-exported: bundle.BundleError)

FORMAT = "specexport-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"

# limits far above any real bundle (SmolLM2: a 30 KB manifest, 7 files, depth 6), so that a hostile one is
# refused before it costs memory or time
MAX_MANIFEST_BYTES = 16 << 20
MAX_DEPTH = 32  # JSON nesting (the deepest real field, models.target.notes.float32_graph_parity.x.T, is 6)
MAX_FILES = 1000
MAX_FILE_BYTES = 1 << 40
MAX_CAPACITY = 1 << 20  # S
MAX_BATCH = 256  # B (the exporter's symbolic batch dimension goes to 256)
MAX_KV_BYTES = 1 << 36  # one model's float32 cache at the full capacity (Llama-7B at 32k slots: 32 GiB)
MAX_TEMPLATE_CHARS = 1 << 20
RESERVED_TEMPLATE_NAMES = ("messages", "add_generation_prompt", "raise_exception", "tools", "documents")
KINDS = ("checkpoint", "early-exit", "int4", "int8")
# "portable": attention from standard ONNX ops (any runtime, TensorRT); "slots": the same inputs and outputs,
# attending over copies of the cache with the new tokens in their slots (verify rows sum as decode rows do:
# OpenVINO's bfloat16); "fused": onnxruntime's GroupQueryAttention contrib op, which writes the step's K/V
# into free cache slots in place
Attention = Literal["fused", "portable", "slots"]
Activations = Literal["float32", "int8"]  # how a quantised graph's MatMulNBits compute (accuracy level 1 or 4)
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
DIM_NAMES = ("B", "T", "S", "L", "R")  # docs/design.md: batch, new tokens, cache slots, cached + new, logit rows


# ModelEntry fields that manifest.json keeps in a "notes" object (where bundles have always kept them), each
# written only when it differs from its default
NOTES = ("verify_drift", "speculative", "activations", "float32_graph_parity", "mixed", "pad_decode",
         "exact_trees")


@dataclass(frozen=True)
class ModelEntry:
    role: str  # "target" | "draft"
    kind: str  # "checkpoint" | "early-exit" | "int4" | "int8"
    source: dict  # {"path": ..., "name": ..., "layers"?: N}
    arch: dict  # GraphConfig.summary(): L, H, Hkv, D, V, ...
    graph: str  # ONNX file, symbolic T; profiles below are the only T values the runtime runs
    weights: str  # external-data file of `graph`
    profiles: dict  # profile name -> T, e.g. {"decode": 1, "prefill": 64, "verify_4": 5}
    inputs: list  # [{"name", "shape", "dtype"}], "T" marks the profile dimension
    outputs: list
    parity: dict  # profile name -> max |logit - eager logit| (checkpoint and early-exit models)
    parity_tolerance: float | None
    engine: dict = field(default_factory=dict)  # TensorRT engine record (exporter/tensorrt.py), {} if none
    attention: Attention = "portable"
    # the target: max |logit difference| between one verify call and one decode call per token (the build
    # measures it; float32 graphs differ by rounding only)
    verify_drift: float | None = None
    # False for a target whose verify calls do not score tokens as plain decoding does (int8 activations):
    # such a bundle decodes plainly only
    speculative: bool = True
    activations: Activations | None = None  # a quantised target: how its MatMulNBits compute
    float32_graph_parity: dict | None = None  # a quantised target: the parity report of the graph it came from
    # a fused target's mixed graph (the engine's: a batch of decode rows plus `groups` single-sequence groups
    # in one call): {"graph": file, "groups": N, "max_abs": its largest |dlogit| from the fused graph's calls}
    mixed: dict | None = None
    # True: a 1-token call of one row runs with a pad token after it (backends/ort.py pad_decode), so that
    # onnxruntime's GroupQueryAttention computes every row as it does in a verify call (an int8-activation
    # target built with --pad-decode: its verify rows then score exactly as its decode rows)
    pad_decode: bool = False
    # False where only a chain's verify rows score exactly as decode rows (int8 activations): recycle drafts
    # its tree's best path, and chains (prompt lookup, a draft model, that path) stay lossless
    exact_trees: bool = True

    @staticmethod
    def from_dict(d: dict) -> "ModelEntry":
        """A checked manifest entry (`check`) -> ModelEntry, its "notes" object read into the typed fields."""
        notes = d.get("notes", {})
        return ModelEntry(**{k: v for k, v in d.items() if k != "notes"}, **{k: notes[k] for k in NOTES if k in notes})

    def to_dict(self) -> dict:
        """The manifest.json object: the note fields that differ from their defaults go under "notes"."""
        d = asdict(self)
        defaults = {f.name: f.default for f in fields(self) if f.name in NOTES}
        notes = {k: v for k, v in ((k, d.pop(k)) for k in NOTES) if v != defaults[k]}
        engine, attention = d.pop("engine"), d.pop("attention")
        return {**d, "notes": notes, "engine": engine, "attention": attention}

    def verify_ks(self) -> list[int]:
        return sorted(int(n.split("_")[1]) for n in self.profiles if n.startswith("verify_"))

    def kv_inputs(self) -> list[str]:
        """past_key.0, past_value.0, past_key.1, ...: the cache inputs, in RingKV.views() order."""
        return [i["name"] for i in self.inputs if i["name"].startswith(("past_key.", "past_value."))]


@dataclass(frozen=True)
class Manifest:
    specexport_version: str
    capacity: int  # S: cache slots per model
    batch: int  # the largest B the graphs were built and checked for (1: single-sequence bundles)
    models: dict  # role -> ModelEntry
    tokenizer: dict  # {"file", "eos_token_ids", "bos_token_id", "chat_template", "special_tokens"}
    files: dict  # file name -> sha256
    build: dict  # options the build ran with, timings
    buckets: list = field(default_factory=list)  # S values the graphs run with (the last = capacity)
    batch_sizes: list = field(default_factory=lambda: [1])  # B values the runtime runs (the last = batch)
    sizes: dict = field(default_factory=dict)  # file name -> bytes (every listed file; {} in older bundles)
    # the recycle drafter's successor table seeded at build time: {"file", "prompts", "tokens"}; {} when none
    successors: dict = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        d = asdict(self)
        d["models"] = {role: e.to_dict() for role, e in self.models.items()}
        return json.dumps(d, indent=2)

    @staticmethod
    def from_dict(d) -> "Manifest":
        """Check `d` against the schema (`check`), then build the dataclasses."""
        check(d)
        return Manifest(**{**d, "models": {k: ModelEntry.from_dict(v) for k, v in d["models"].items()}})

    @property
    def target(self) -> ModelEntry:
        return self.models["target"]

    @property
    def draft(self) -> ModelEntry | None:
        return self.models.get("draft")


def buckets_for(capacity: int, smallest: int = 32) -> list[int]:
    """Capacity buckets: capacity, capacity/2, capacity/4, ... down to `smallest` slots."""
    out = [capacity]
    while out[-1] // 2 >= smallest:
        out.append(out[-1] // 2)
    return sorted(out)


# ---- the schema: every field the runtime, the CLI or `inspect` reads, with its type and range

def _bad(where: str, what: str, got=None) -> BundleError:
    shown = "" if got is None else f", got {_show(got)}"
    return BundleError(f"{MANIFEST}: {where} {what}{shown}: rebuild the bundle with `specexport build`")


def _show(x) -> str:
    r = repr(x)
    return (r if len(r) <= 60 else r[:57] + "...") + f" ({type(x).__name__})"


def _obj(d, where: str, required=(), optional=(), free: bool = False) -> dict:
    """`d` must be a JSON object with string keys, all of `required`, and (unless free) no others."""
    if not isinstance(d, dict):
        raise _bad(where, "must be an object", d)
    for k in required:
        if k not in d:
            raise _bad(f"{where}.{k}" if where else k, "is missing")
    if not free:
        extra = sorted(k for k in d if k not in required and k not in optional)
        if extra:
            raise _bad(where or "the manifest", f"has unknown field {extra[0]!r}")
    return d


def _int(x, where: str, lo: int, hi: int) -> int:
    if type(x) is not int or not lo <= x <= hi:  # type(): bool is an int subclass, and never a count
        raise _bad(where, f"must be an integer in [{lo}, {hi}]", x)
    return x


def _num(x, where: str, finite: bool = True, lo: float = -math.inf) -> float:
    # an int beyond 2**53 is no measurement, and isfinite() of one past 1e308 raises OverflowError
    if type(x) not in (int, float) or (type(x) is int and abs(x) > 2 ** 53) or (finite and not math.isfinite(x)) \
            or x < lo:
        bound = f" >= {lo:g}" if lo > -math.inf else ""
        raise _bad(where, f"must be a {'finite ' if finite else ''}number{bound}", x)
    return x


def _str(x, where: str, limit: int = 256, choices=None) -> str:
    if not isinstance(x, str) or len(x) > limit or (choices is not None and x not in choices):
        what = f"must be one of {', '.join(choices)}" if choices else f"must be a string of at most {limit} characters"
        raise _bad(where, what, x)
    return x


def _bool(x, where: str) -> bool:
    if type(x) is not bool:
        raise _bad(where, "must be true or false", x)
    return x


def _list(x, where: str, limit: int) -> list:
    if not isinstance(x, list) or len(x) > limit:
        raise _bad(where, f"must be a list of at most {limit} items", x)
    return x


def relpath(name, where: str) -> str:
    """A plain relative path inside the bundle: '/'-separated parts, none empty, '.' or '..', no absolute
    path, no backslash or control character (what a manifest may name; the file itself is checked on disk)."""
    if not isinstance(name, str) or not 0 < len(name) <= 1024:
        raise _bad(where, "must be a relative path inside the bundle", name)
    parts = name.split("/")
    if (any(p in ("", ".", "..") or len(p) > 255 for p in parts) or "\\" in name
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise _bad(where, "must be a plain relative path inside the bundle (no '..', no absolute path, no "
                   "empty or '.' parts, no backslash or control character)", name)
    if name == MANIFEST:
        raise _bad(where, f"must name a bundle file, not {MANIFEST}", name)
    return name


def check(d) -> None:
    """Raise BundleError naming the first field of manifest `d` (parsed JSON) that breaks the schema."""
    _obj(d, "", free=True)
    if d.get("format") != FORMAT:
        raise BundleError(f"not a specexport bundle (format={_show(d.get('format'))} in {MANIFEST})")
    if d.get("format_version") != FORMAT_VERSION or type(d.get("format_version")) is not int:
        raise BundleError(f"bundle format_version {_show(d.get('format_version'))} but this specexport reads "
                          f"version {FORMAT_VERSION}: rebuild it with `specexport build`")
    _obj(d, "", required=("specexport_version", "capacity", "batch", "models", "tokenizer", "files", "build",
                          "buckets", "format", "format_version"), optional=("batch_sizes", "sizes", "successors"))
    _str(d["specexport_version"], "specexport_version", 64)
    _obj(d["build"], "build", free=True)
    S = _int(d["capacity"], "capacity", 8, MAX_CAPACITY)
    buckets = _list(d["buckets"], "buckets", 32)
    if not buckets or buckets[-1] != S:
        raise _bad("buckets", f"must end at the capacity ({S})", buckets)
    for i, b in enumerate(buckets):
        _int(b, f"buckets[{i}] (rising to the capacity)", 2 if i == 0 else buckets[i - 1] + 1, S)
    B = _int(d["batch"], "batch", 1, MAX_BATCH)
    sizes_b = _list(d.get("batch_sizes", [1]), "batch_sizes", MAX_BATCH)
    if not sizes_b or sizes_b[-1] != B:
        raise _bad("batch_sizes", f"must end at the batch ({B})", sizes_b)
    for i, b in enumerate(sizes_b):
        _int(b, f"batch_sizes[{i}] (rising to the batch)", 1 if i == 0 else sizes_b[i - 1] + 1, B)
    files = _check_files(d)
    models = _obj(d["models"], "models", required=("target",), optional=("draft",))
    for role, e in models.items():
        _check_model(e, f"models.{role}", role, S, B, files)
    t, dr = models["target"], models.get("draft")
    V = t["arch"]["vocab_size"]
    if dr is not None and dr["arch"]["vocab_size"] != V:
        raise _bad("models.draft.arch.vocab_size", f"must equal the target's vocabulary size {V}",
                   dr["arch"]["vocab_size"])
    if not any(n.startswith("verify_") for n in t["profiles"]):
        raise _bad("models.target.profiles", "must hold at least one verify_<k> profile", t["profiles"])
    if dr is not None and any(n.startswith("verify_") for n in dr["profiles"]):
        raise _bad("models.draft.profiles", "must hold no verify profile (a draft proposes, the target verifies)")
    _check_tokenizer(d["tokenizer"], V, files)
    if d.get("successors"):
        seed = _obj(d["successors"], "successors", required=("file", "prompts", "tokens"))
        _listed(seed["file"], "successors.file", files)
        _int(seed["prompts"], "successors.prompts", 0, 1 << 20)
        _int(seed["tokens"], "successors.tokens", 0, 1 << 30)


def _check_files(d) -> dict:
    files = _obj(d["files"], "files", free=True)
    if not 0 < len(files) <= MAX_FILES:
        raise _bad("files", f"must list between 1 and {MAX_FILES} files", len(files))
    for name, digest in files.items():
        relpath(name, f"files key {name!r}")
        if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise _bad(f"files[{name!r}]", "must be a sha256 (64 lowercase hex digits)", digest)
    sizes = _obj(d.get("sizes", {}), "sizes", free=True)
    if sizes and set(sizes) != set(files):
        odd = sorted(set(sizes) ^ set(files))[0]
        raise _bad("sizes", f"must record exactly the files in files{{}} (differs at {odd!r})")
    for name, n in sizes.items():
        _int(n, f"sizes[{name!r}]", 0, MAX_FILE_BYTES)
    return files


def _listed(name, where: str, files: dict) -> str:
    relpath(name, where)
    if name not in files:
        raise _bad(where, "must name a file listed (and hashed) in files{}", name)
    return name


def _check_model(e, where: str, role: str, S: int, B: int, files: dict) -> None:
    _obj(e, where, required=("role", "kind", "source", "arch", "graph", "weights", "profiles", "inputs",
                             "outputs", "parity", "parity_tolerance"), optional=("notes", "engine", "attention"))
    if e["role"] != role:
        raise _bad(f"{where}.role", f"must be {role!r}", e["role"])
    _str(e["kind"], f"{where}.kind", choices=KINDS if role == "draft" else ("checkpoint", "int4", "int8"))
    attention = _str(e.get("attention", "portable"), f"{where}.attention", choices=("fused", "portable", "slots"))
    src = _obj(e["source"], f"{where}.source", free=True)
    for k in ("name", "path"):
        if k in src:
            _str(src[k], f"{where}.source.{k}", 4096)
    a = _check_arch(e["arch"], f"{where}.arch")
    L, Hkv, D, V = a["num_layers"], a["num_kv_heads"], a["head_dim"], a["vocab_size"]
    if L * 2 * B * Hkv * S * D * 4 > MAX_KV_BYTES:
        raise _bad(f"{where}.arch", f"needs a {L * 2 * B * Hkv * S * D * 4 / 2**30:.0f} GiB cache at capacity {S} "
                   f"and batch {B} (the limit is {MAX_KV_BYTES >> 30} GiB)")
    _listed(e["graph"], f"{where}.graph", files)
    if not e["graph"].endswith(".onnx"):
        raise _bad(f"{where}.graph", "must name an .onnx file", e["graph"])
    _listed(e["weights"], f"{where}.weights", files)
    if e["weights"] == e["graph"]:
        raise _bad(f"{where}.weights", "must be the graph's external-data file, not the graph", e["weights"])
    _check_profiles(e["profiles"], f"{where}.profiles", S, role)
    _check_io(e["inputs"], e["outputs"], where, attention, L, Hkv, D, V)
    _check_parity(e["parity"], f"{where}.parity", S)
    if e["parity_tolerance"] is not None:
        _num(e["parity_tolerance"], f"{where}.parity_tolerance", lo=0)
    notes = _obj(e.get("notes", {}), f"{where}.notes", optional=NOTES)
    if "verify_drift" in notes:
        _num(notes["verify_drift"], f"{where}.notes.verify_drift", finite=False)
    if "speculative" in notes:
        _bool(notes["speculative"], f"{where}.notes.speculative")
    if "activations" in notes:
        _str(notes["activations"], f"{where}.notes.activations", choices=("float32", "int8"))
    if "exact_trees" in notes:
        _bool(notes["exact_trees"], f"{where}.notes.exact_trees")
    if "pad_decode" in notes:
        _bool(notes["pad_decode"], f"{where}.notes.pad_decode")
    if "float32_graph_parity" in notes:
        _check_parity(notes["float32_graph_parity"], f"{where}.notes.float32_graph_parity", S)
    if "mixed" in notes:
        mixed = _obj(notes["mixed"], f"{where}.notes.mixed", required=("graph", "groups", "max_abs"))
        _listed(mixed["graph"], f"{where}.notes.mixed.graph", files)
        if not mixed["graph"].endswith(".onnx") or mixed["graph"] == e["graph"]:
            raise _bad(f"{where}.notes.mixed.graph", "must name an .onnx file other than the graph", mixed["graph"])
        _int(mixed["groups"], f"{where}.notes.mixed.groups", lo=1, hi=8)
        _num(mixed["max_abs"], f"{where}.notes.mixed.max_abs", lo=0)
        if attention != "fused" or role != "target":
            raise _bad(f"{where}.notes.mixed", "is for a fused target graph only", f"{role} {attention}")
    engine = _obj(e.get("engine", {}), f"{where}.engine", free=True)
    if engine:
        _listed(engine.get("file"), f"{where}.engine.file", files)
        _obj(engine.get("profile_of_T"), f"{where}.engine.profile_of_T", free=True)


def _check_parity(rep, where: str, S: int) -> None:
    """A parity report: profile name -> {"T", "S", "max_abs", "top1", ...}."""
    for name, p in _obj(rep, where, free=True).items():
        pw = f"{where}.{name}"
        _str(name, pw, 64)
        _obj(p, pw, required=("T", "S", "max_abs", "top1"), free=True)
        _int(p["T"], f"{pw}.T", 1, S)
        _int(p["S"], f"{pw}.S", 1, MAX_CAPACITY)
        _num(p["max_abs"], f"{pw}.max_abs", finite=False)
        _num(p["top1"], f"{pw}.top1", finite=False)


ARCH_INTS = {"vocab_size": 1 << 22, "hidden_size": 1 << 17, "intermediate_size": 1 << 19, "num_layers": 1024,
             "num_heads": 1024, "num_kv_heads": 1024, "head_dim": 1024}


def _check_arch(a, where: str) -> dict:
    flags = ("tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias")
    _obj(a, where, required=("arch", *ARCH_INTS, "rms_norm_eps", "rope_type", "inv_freq", "rope_scaling", *flags),
         optional=("sliding_window",))
    _str(a["arch"], f"{where}.arch", 128)
    _str(a["rope_type"], f"{where}.rope_type", 64)
    for k, hi in ARCH_INTS.items():
        _int(a[k], f"{where}.{k}", 1, hi)
    for k in flags:
        _bool(a[k], f"{where}.{k}")
    if a["num_heads"] % a["num_kv_heads"]:
        raise _bad(f"{where}.num_kv_heads", f"must divide num_heads {a['num_heads']}", a["num_kv_heads"])
    if a["head_dim"] % 2:
        raise _bad(f"{where}.head_dim", "must be even (rotary pairs)", a["head_dim"])
    _num(a["rms_norm_eps"], f"{where}.rms_norm_eps", lo=0)
    _num(a["rope_scaling"], f"{where}.rope_scaling")
    inv = _list(a["inv_freq"], f"{where}.inv_freq", 512)
    if len(inv) * 2 != a["head_dim"]:
        raise _bad(f"{where}.inv_freq", f"must hold head_dim/2 = {a['head_dim'] // 2} numbers", len(inv))
    for i, f in enumerate(inv):
        _num(f, f"{where}.inv_freq[{i}]")
    if a.get("sliding_window") is not None:
        _int(a["sliding_window"], f"{where}.sliding_window", 1, 1 << 30)
    return a


def _check_profiles(p, where: str, S: int, role: str) -> None:
    """decode (T=1) always; prefill and catchup any T; prefill_<T> (a long prefill profile) and verify_<k>
    (T = k+1: the step feeds the last committed token and k drafts) as named. The runtime runs exactly these
    T values."""
    _obj(p, where, required=("decode",), free=True)
    if not 0 < len(p) <= 64:
        raise _bad(where, "must hold between 1 and 64 profiles", len(p))
    for name, T in p.items():
        _int(T, f"{where}.{name}", 1, S)
        m = re.fullmatch(r"verify_([1-9][0-9]{0,3})", name)
        if m and T != int(m.group(1)) + 1:
            raise _bad(f"{where}.{name}", f"must be k+1 = {int(m.group(1)) + 1}", T)
        long = re.fullmatch(r"prefill_([1-9][0-9]{0,5})", name)
        if long and T != int(long.group(1)):
            raise _bad(f"{where}.{name}", f"must be {int(long.group(1))}", T)
        if not m and not long and name not in ("decode", "prefill", "catchup"):
            raise _bad(f"{where}.{name}", "is not a profile name (decode, prefill, prefill_<T>, catchup, verify_<k>)")
    if p["decode"] != 1:
        raise _bad(f"{where}.decode", "must be 1", p["decode"])


def _check_io(inputs, outputs, where: str, attention: str, L: int, Hkv: int, D: int, V: int) -> None:
    """Graph inputs and outputs: the names the backends feed and read, in order, with the arch's numbers in
    their shapes (the onnxruntime session's own I/O is checked against these at load: check_graph_io)."""
    kv = [f"past_{n}.{i}" for i in range(L) for n in ("key", "value")]
    if attention != "fused":
        rows = ["logit_rows"] if attention == "slots" else []
        want_in, want_out = ["input_ids", "position_ids", "past_mask", "new_mask"] + rows + kv, ["logits", "new_kv"]
    else:
        want_in = ["input_ids", "position_ids", "attn_bias", "seqlens_k", "total_len", "logit_rows"] + kv
        # new_kv: bundles built before 2026-12-03 (since then the K/V are only written in place)
        want_out = ["logits", "new_kv", "top_ids"] + ["present_" + n[len("past_"):] for n in kv]
    for side, specs, want in (("inputs", inputs, want_in), ("outputs", outputs, want_out)):
        _list(specs, f"{where}.{side}", 4 * L + 16)
        for i, s in enumerate(specs):
            _obj(s, f"{where}.{side}[{i}]", required=("name", "shape", "dtype"))
            _str(s["name"], f"{where}.{side}[{i}].name", 64)
            _str(s["dtype"], f"{where}.{side}[{i}].dtype", choices=DTYPES)
            for j, dim in enumerate(_list(s["shape"], f"{where}.{side}[{i}].shape", 8)):
                if not (dim in DIM_NAMES or (type(dim) is int and 0 <= dim <= 1 << 22)):
                    raise _bad(f"{where}.{side}[{i}].shape[{j}]",
                               f"must be a size or one of {', '.join(DIM_NAMES)}", dim)
        names = [s["name"] for s in specs]
        # bundles built before these have all-row logits, no top ids; fused ones since have no new_kv
        optional = ("logit_rows", "top_ids") + (("new_kv",) if attention == "fused" else ())
        if names != [n for n in want if n in names or n not in optional]:
            raise _bad(f"{where}.{side}", f"must be {', '.join(want[:8])}{', ...' if len(want) > 8 else ''} "
                       f"for a {L}-layer {attention} graph", ", ".join(names[:8]))
    spec = {s["name"]: s for s in inputs + outputs}

    def dims(name, expect):  # expect: {axis: size} where the arch fixes the size
        got = spec[name]["shape"]
        for ax, n in expect.items():
            if len(got) <= max(expect) or got[ax] != n:
                raise _bad(f"{where}: {name}.shape", f"must have {n} at axis {ax} (the arch's numbers)", got)

    for n in kv:
        dims(n, {1: Hkv, 3: D})
    dims("logits", {2: V})
    if "new_kv" in spec:
        dims("new_kv", {0: L, 1: 2, 3: Hkv, 5: D})
    if "top_ids" in spec:
        shape = spec["top_ids"]["shape"]
        k = shape[-1] if len(shape) == 3 else None  # [B, R, k]
        if type(k) is not int or not 1 <= k <= V:
            raise _bad(f"{where}: top_ids.shape[-1]", f"must be a count in [1, {V}]", k)
    for n, dt in (("input_ids", "int64"), ("position_ids", "int64"), ("logits", "float32"), ("new_kv", "float32")):
        if n in spec and spec[n]["dtype"] != dt:
            raise _bad(f"{where}: {n}.dtype", f"must be {dt}", spec[n]["dtype"])


def _check_tokenizer(tk, V: int, files: dict) -> None:
    _obj(tk, "tokenizer", required=("file", "eos_token_ids"), optional=("bos_token_id", "chat_template",
                                                                       "special_tokens"))
    _listed(tk["file"], "tokenizer.file", files)
    for i, t in enumerate(_list(tk["eos_token_ids"], "tokenizer.eos_token_ids", 64)):
        _int(t, f"tokenizer.eos_token_ids[{i}]", 0, V - 1)
    if tk.get("bos_token_id") is not None:
        _int(tk["bos_token_id"], "tokenizer.bos_token_id", 0, V - 1)
    if tk.get("chat_template") is not None:
        _str(tk["chat_template"], "tokenizer.chat_template", MAX_TEMPLATE_CHARS)
    special = _obj(tk.get("special_tokens", {}), "tokenizer.special_tokens", free=True)
    if len(special) > 64:
        raise _bad("tokenizer.special_tokens", "must hold at most 64 names", len(special))
    for k, v in special.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", k) or k in RESERVED_TEMPLATE_NAMES:
            raise _bad(f"tokenizer.special_tokens key {k!r}", "must be a template variable name other than "
                       + ", ".join(RESERVED_TEMPLATE_NAMES))
        _str(v, f"tokenizer.special_tokens.{k}", 4096)


def check_graph_io(entry: ModelEntry, inputs: list, outputs: list) -> None:
    """The graph onnxruntime loaded against the manifest: same input/output names in order, same dtypes, and
    every size the manifest fixes fixed to it (an arch number that lies about the graph is refused at load,
    not at the first generate). inputs/outputs: [(name, shape, dtype)], shape items int or a dim name/None."""
    where = f"models.{entry.role}.graph"
    for side, specs, got in (("inputs", entry.inputs, inputs), ("outputs", entry.outputs, outputs)):
        if [s["name"] for s in specs] != [g[0] for g in got]:
            raise BundleError(f"{entry.graph}: the graph's {side} ({', '.join(g[0] for g in got[:6])}, ...) are "
                              f"not the manifest's {where} {side}: the manifest or the graph was changed; rebuild "
                              "the bundle")
        for s, (name, shape, dtype) in zip(specs, got):
            fixed = [d if type(d) is int else None for d in shape]
            want = [d if type(d) is int else None for d in s["shape"]]
            # a dim the manifest declares variable ("T") may not be fixed in the graph, nor the reverse
            if len(fixed) != len(want) or any(a != b for a, b in zip(fixed, want) if a is not None or b is not None):
                raise BundleError(f"{entry.graph}: {name} has shape {list(shape)} in the graph but {s['shape']} in "
                                  f"the manifest ({where}): rebuild the bundle")
            if dtype != s["dtype"]:
                raise BundleError(f"{entry.graph}: {name} is {dtype} in the graph but {s['dtype']} in the manifest "
                                  f"({where}): rebuild the bundle")


# ---- files on disk: containment, regular files only, bounded reads

def _open_regular(path: Path, shown: str) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without following a symlink or blocking on a FIFO -> (fd, fstat)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise BundleError(f"bundle file {shown} is missing: rebuild the bundle") from None
    except OSError as e:  # ELOOP: a symlink; EACCES; ...
        raise BundleError(f"bundle file {shown} cannot be opened as a regular file ({e.strerror}): "
                          "rebuild the bundle (a bundle holds no symlinks)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise BundleError(f"bundle file {shown} is not a regular file: rebuild the bundle")
    return fd, st


def _read_fd(fd: int, limit: int, shown: str, sink=None) -> bytes:
    """Read at most `limit` bytes (refusing a file that holds more); into `sink` if given, else returned."""
    parts, n = [], 0
    while True:
        block = os.read(fd, min(1 << 22, limit + 1 - n))
        if not block:
            return b"".join(parts)
        n += len(block)
        if n > limit:
            raise BundleError(f"bundle file {shown} is larger than its recorded or allowed size ({limit} bytes): "
                              "rebuild the bundle")
        if sink is not None:
            sink(block)
        else:
            parts.append(block)


def read_bytes(root: str | Path, name: str, limit: int) -> bytes:
    """The contents of bundle file `name` (already checked by `read`), at most `limit` bytes."""
    fd, _ = _open_regular(Path(root) / relpath(name, "file"), name)
    try:
        return _read_fd(fd, limit, name)
    finally:
        os.close(fd)


def sha256(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    h = hashlib.sha256()
    fd, _ = _open_regular(Path(path), str(path))
    try:
        _read_fd(fd, limit, str(path), sink=h.update)
    finally:
        os.close(fd)
    return h.hexdigest()


def _tree(root: Path) -> dict:
    """Every file under root -> its lstat size, refusing symlinks and special files, never following one."""
    found, stack = {}, [("", 0)]
    while stack:
        rel, depth = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for entry in it:
                name = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_symlink():
                    raise BundleError(f"bundle entry {name} is a symlink: a bundle holds regular files only "
                                      "(copy the file in, or rebuild the bundle)")
                if entry.is_dir(follow_symlinks=False):
                    if depth >= 16:
                        raise BundleError(f"bundle directory {name} is nested too deeply: rebuild the bundle")
                    stack.append((name, depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    found[name] = entry.stat(follow_symlinks=False).st_size
                else:
                    raise BundleError(f"bundle entry {name} is a special file (FIFO, socket or device): "
                                      "a bundle holds regular files only; rebuild the bundle")
                if len(found) + len(stack) > 4 * MAX_FILES:
                    raise BundleError(f"{root} holds too many files to be a bundle")
    return found


def read(path: str | Path, verify: bool = True) -> Manifest:
    """Read and check a bundle: the manifest whole, then its files on disk (exactly the listed ones, regular
    files inside the bundle); with verify, also each file's recorded size and sha256. verify=False skips only
    the contents (size and hash), never the path and file-type checks."""
    root = Path(path)
    if not root.is_dir():
        raise BundleError(f"{root} is not a directory: a bundle is the directory `specexport build --out` wrote")
    if not (root / MANIFEST).exists() and not (root / MANIFEST).is_symlink():
        raise BundleError(f"{root} has no {MANIFEST}: is it a bundle written by `specexport build`?")
    fd, _ = _open_regular(root / MANIFEST, MANIFEST)
    try:
        raw = _read_fd(fd, MAX_MANIFEST_BYTES, MANIFEST)
    finally:
        os.close(fd)
    m = Manifest.from_dict(_parse(raw, root / MANIFEST))
    try:
        on_disk = _tree(root)
    except OSError as e:  # an unreadable directory inside the bundle
        raise BundleError(f"cannot list {e.filename or root} ({e.strerror}): check the bundle's permissions") from None
    on_disk.pop(MANIFEST, None)
    unlisted = sorted(set(on_disk) - set(m.files))
    if unlisted:
        raise BundleError(f"bundle file {unlisted[0]} is not listed in the manifest's files{{}}: a bundle holds "
                          "exactly the files it lists (remove it, or rebuild the bundle)")
    for name, digest in m.files.items():
        if name not in on_disk:
            raise BundleError(f"bundle file {name} is missing from {root}: rebuild the bundle")
        size = m.sizes.get(name, on_disk[name])
        if verify and on_disk[name] != size:
            raise BundleError(f"bundle file {name} has {on_disk[name]} bytes but the manifest records {size} bytes "
                              "(and its sha256): changed or truncated since the build; rebuild the bundle with "
                              "`specexport build`")
        if verify and sha256(root / name, limit=size) != digest:
            raise BundleError(f"bundle file {name} does not match its sha256 in the manifest (changed or "
                              f"truncated since the build): rebuild the bundle with `specexport build`")
    return m


_OUTSIDE = re.compile(r'"(?:[^"\\]++|\\(?:.|\Z))*+(?:"|\Z)|[\[\]{}]', re.S)


def _parse(raw: bytes, shown: Path) -> dict:
    """JSON with a nesting limit checked before parsing (json itself recurses once per level)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"{shown} is not UTF-8 ({e.reason} at byte {e.start}): rebuild the bundle") from None
    depth = deepest = 0
    # brackets outside strings; possessive, and a string may end at the end of the text: every match succeeds
    # without backtracking, so the scan is linear even over an unclosed string full of escaped quotes (the
    # plain "(?:[^"\\]|\\.)*" pattern took seconds per 32 KB there, and days at the 16 MiB limit)
    for tok in _OUTSIDE.finditer(text):
        c = tok.group()
        depth += 1 if c in "[{" else -1 if c in "]}" else 0
        deepest = max(deepest, depth)
        if depth > 8 * MAX_DEPTH:  # too deep to parse safely, so too deep to say where
            raise BundleError(f"{shown} nests deeper than {MAX_DEPTH} levels: not a manifest; rebuild the bundle")
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, an integer of more than 4300 digits
        raise BundleError(f"{shown} is not valid JSON ({e}): rebuild the bundle") from None
    if not isinstance(d, dict):
        raise BundleError(f"{shown} holds a JSON {type(d).__name__}, not an object: rebuild the bundle")
    if deepest > MAX_DEPTH:
        raise _bad(_deep_field(d), f"nests deeper than {MAX_DEPTH} levels")
    return d


def _deep_field(d) -> str:
    """The dotted name of the first field holding a value nested more than MAX_DEPTH levels down."""
    stack = [(d, [], 1)]
    while stack:
        x, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:6]).lstrip(".")
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        stack.extend((v, path + [k], depth + 1) for k, v in items if isinstance(v, (dict, list)))
    return "the manifest"


def describe(m: Manifest, root: Path | None = None) -> str:
    """A person's view of a manifest (`specexport inspect`)."""
    lines = [f"specexport bundle v{m.format_version} (specexport {m.specexport_version}), "
             f"capacity {m.capacity} (buckets {m.buckets}), batch {m.batch}, built {m.build.get('created', '?')}"]
    for role, e in m.models.items():
        a = e.arch
        lines.append(f"{role}: {e.kind} {e.source.get('name')} - {a['arch']} L={a['num_layers']} "
                     f"E={a['hidden_size']} H={a['num_heads']}/{a['num_kv_heads']} D={a['head_dim']} "
                     f"V={a['vocab_size']} rope={a['rope_type']} attention={e.attention}")
        for name, p in e.parity.items():
            lines.append(f"  {name:16s} T={p['T']:<3d} S={p['S']:<5d} max|dlogit| {p['max_abs']:.2e}  "
                         f"top-1 {p['top1']:.2f}")
        if e.verify_drift is not None:
            plain_only = (f" ({e.activations} activations: plain decoding only)" if not e.speculative else
                          f" ({e.activations} activations{', 1-token calls padded' if e.pad_decode else ''}: chains "
                          "verify exactly, trees do not, so recycle drafts chains)" if not e.exact_trees else "")
            lines.append(f"  verify vs decode max|dlogit| {e.verify_drift:.2e}{plain_only}")
        if e.mixed:
            lines.append(f"  mixed graph {e.mixed['graph']}: a batch + {e.mixed['groups']} group(s) per call, "
                         f"vs the fused graph's calls max|dlogit| {e.mixed['max_abs']:.2e}")
    lines.append(f"tokenizer: eos {m.tokenizer['eos_token_ids']}, chat template "
                 f"{'yes' if m.tokenizer.get('chat_template') else 'no'}")
    seed = m.successors
    lines.append(f"successor table: {seed['file']}, seeded from {seed['tokens']} tokens on {seed['prompts']} prompts"
                 if seed else "successor table: none shipped (recycle starts empty)")
    if root is not None:
        size = sum((root / f).stat().st_size for f in m.files)
        lines.append(f"files: {len(m.files)}, {size / 1e6:.0f} MB")
    lines.append(f"build: {json.dumps(m.build.get('timings', {}))}")
    return "\n".join(lines)
