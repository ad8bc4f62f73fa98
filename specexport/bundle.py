"""The contract between exporter and runtime: manifest.json <-> frozen dataclasses, plus load-time checks.

Pure Python (no numpy, no torch). A bundle directory holds manifest.json, one ONNX graph and one weights
file per model, and the tokenizer files. The runtime refuses a bundle whose format version is not
FORMAT_VERSION or whose files do not match their recorded sha256, before any model is loaded.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import BundleError  # noqa: F401  (re-exported: bundle.BundleError)

FORMAT = "specexport-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


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
    notes: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)  # TensorRT engine record (exporter/tensorrt.py), {} if none
    # "portable": attention from standard ONNX ops (any runtime, TensorRT); "fused": onnxruntime's
    # GroupQueryAttention contrib op, which writes the step's K/V into free cache slots in place
    attention: str = "portable"

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
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_dict(d: dict) -> "Manifest":
        if d.get("format") != FORMAT:
            raise BundleError(f"not a specexport bundle (format={d.get('format')!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise BundleError(f"bundle format version {d.get('format_version')} but this specexport reads "
                              f"version {FORMAT_VERSION}: rebuild it with `specexport build`")
        try:
            models = {k: ModelEntry(**v) for k, v in d["models"].items()}
            return Manifest(**{**d, "models": models})
        except TypeError as e:
            raise BundleError(f"manifest does not match the schema ({e}): rebuild it with `specexport build`") from None

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


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def read(path: str | Path, verify: bool = True) -> Manifest:
    """Read and check a bundle's manifest; with verify, every file's sha256 too."""
    root = Path(path)
    mf = root / MANIFEST
    if not mf.exists():
        raise BundleError(f"{root} has no {MANIFEST}: is it a bundle written by `specexport build`?")
    try:
        m = Manifest.from_dict(json.loads(mf.read_text()))
    except json.JSONDecodeError as e:
        raise BundleError(f"{mf} is not valid JSON ({e}): rebuild the bundle") from None
    if not m.buckets or m.buckets[-1] != m.capacity:
        raise BundleError(f"{mf} has capacity buckets {m.buckets} that do not end at its capacity {m.capacity}: "
                          "rebuild the bundle")
    if "target" not in m.models:
        raise BundleError(f"{mf} names no target model: rebuild the bundle")
    for name, digest in m.files.items():
        f = root / name
        if not f.exists():
            raise BundleError(f"bundle file {name} is missing from {root}: rebuild the bundle")
        if verify and sha256(f) != digest:
            raise BundleError(f"bundle file {name} does not match its sha256 in the manifest (changed or "
                              f"truncated since the build): rebuild the bundle with `specexport build`")
    return m
