"""`specexport build`: checkpoint(s) -> parity-checked bundle. The only place that writes bundles.

Everything is written into a work directory beside the output and moved into place at the end, so a
build that fails or is interrupted leaves no half-written bundle, and --out holds the old or the new bundle
at every instant of a --force rebuild (exporter/output.py). The last step reads the bundle back through the
loader's own check (bundle.read), so a build never writes a bundle the loader refuses.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from .. import __version__, bundle
from ..bundle import Activations, Attention, Manifest, ModelEntry
from ..errors import BuildError, BundleError, SpecExportError
from . import output
from .progress import Bars, third_party_quiet

logger = logging.getLogger("specexport.build")

DRAFT_HELP = ("a checkpoint (directory, short name or cached hub id), or a draft derived from the target: "
              "self:layers=N (early exit: first N layers + final norm + head), self:int4 or self:int8 "
              "(weight-only quantised copy), or none")


Quant = Literal["int4", "int8"]  # weight-only MatMulNBits bits
Engine = Literal["tensorrt"]
Precision = Literal["fp32", "fp16", "bf16"]  # TensorRT builder flag over the float32 ONNX graph
DraftKind = Literal["none", "checkpoint", "early-exit", "int4", "int8"]


@dataclass(frozen=True)
class DraftSpec:
    kind: DraftKind
    source: str | None = None  # checkpoint: directory, short name or cached hub id
    layers: int | None = None  # early-exit: the target's first N layers

    @staticmethod
    def parse(s: str | None) -> "DraftSpec":
        if s is None or s == "none":
            return DraftSpec("none")
        if not s.startswith("self:"):
            return DraftSpec("checkpoint", s)
        m = re.fullmatch(r"self:(?:layers=(\d+)|(int4|int8))", s)
        if not m:
            raise ValueError(f"bad --draft {s!r}: expected {DRAFT_HELP}")
        return DraftSpec("early-exit", layers=int(m.group(1))) if m.group(1) else DraftSpec(m.group(2))


def _one_of(value, kind, option: str, what: str = "") -> None:
    """`value` must be one of the Literal `kind`'s values (None passes where the field is optional)."""
    if value is not None and value not in get_args(kind):
        raise ValueError(f"{option} must be {what or ' or '.join(get_args(kind))}, got {value!r}")


LONG_PREFILL = (128, 256)  # the default long prefill profiles (docs/benchmarks.md "Time to first token")
# the default verify k: the T = k + 1 with B x T <= 9 rows for B = 1..4 (T = 9, 4, 3, 2), the calls that the
# MatMul kernel's 9-row register blocks make in one pass over the weights, so a verify of them costs about what a
# decode call of B rows does (a 10th row starts a second pass), plus k = 4 for fixed-k users; the calls' costs and
# what k = "auto" made with and without them: docs/benchmarks.md "Verify profiles that fit one pass"
DEFAULT_KS = (1, 2, 3, 4, 8)


@dataclass(frozen=True)
class BuildConfig:
    """What `specexport build` was asked for. None means "not asked": no quantised target, no engine, and for
    `attention` the default that `resolved()` fills in (portable with an engine, else fused)."""
    target: str
    out: Path
    draft: DraftSpec = DraftSpec("none")
    ks: tuple[int, ...] = DEFAULT_KS
    capacity: int = 2048
    prefill_chunk: int = 64
    # T of extra prefill profiles for prompts that prefill alone (a solo generation, an idle engine): fewer,
    # larger calls (docs/benchmarks.md "Time to first token"); None: those of LONG_PREFILL that fit the capacity
    long_prefill: tuple[int, ...] | None = None
    tolerance: float = 1e-3  # max |logit - eager logit|, float32
    force: bool = False
    target_quant: Quant | None = None  # ship a weight-only quantised target (output exact w.r.t. it)
    # how the quantised target computes (onnxruntime accuracy level 1 or 4); int8 is faster but a verify call
    # scores a token differently from a decode call, so such a bundle decodes plainly only (unless pad_decode)
    target_activations: Activations = "float32"
    pad_decode: bool = False  # int8 activations: 1-token calls get a pad token, so chain drafts verify exactly
    engine: Engine | None = None  # also build TensorRT engines (needs TensorRT and a GPU here)
    # fused: onnxruntime GroupQueryAttention (the CPU default); portable: standard ONNX ops (TensorRT, the device
    # backends); None: portable with an engine, else fused (resolved())
    attention: Attention | None = None
    engine_precision: Precision = "fp16"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)  # B values the engine may run (sequences per target call)
    # single-sequence groups of the mixed graph (a fused float32 target with B > 1: the engine's call of decode
    # rows + a prefill chunk or verify tree); 0: no mixed graph
    mixed_groups: int = 1
    # new tokens per prompt of the generation that seeds the recycle drafter's successor table (exporter/seed.py);
    # 0: no seeded table, every pipeline starts with an empty one
    seed_tokens: int = 256

    def __post_init__(self):
        if not self.ks or any((not isinstance(k, int)) or k < 1 for k in self.ks):
            raise ValueError(f"--k values must be integers >= 1, got {list(self.ks)}")
        if not 8 <= self.capacity <= bundle.MAX_CAPACITY:  # the loader's bounds: say so before the export
            raise ValueError(f"--capacity must be between 8 and {bundle.MAX_CAPACITY} slots, got {self.capacity}")
        if max(self.ks) + 1 >= self.capacity:
            raise ValueError(f"k={max(self.ks)} does not fit a capacity of {self.capacity}: verify needs k+1 "
                             "new slots and room for a prompt; lower --k or raise --capacity")
        if not 1 <= self.prefill_chunk <= self.capacity:
            raise ValueError(f"--prefill-chunk must be between 1 and the capacity ({self.capacity}), "
                             f"got {self.prefill_chunk}")
        if self.long_prefill is not None and any(
                not isinstance(t, int) or not self.prefill_chunk < t <= self.capacity for t in self.long_prefill):
            raise ValueError(f"--long-prefill values must be above --prefill-chunk ({self.prefill_chunk}) and at most "
                             f"the capacity ({self.capacity}), got {list(self.long_prefill)}")
        _one_of(self.target_quant, Quant, "--quantize-target")
        if self.target_quant and self.draft.kind == self.target_quant:
            raise ValueError(f"a self:{self.target_quant} draft of an {self.target_quant} target is the target "
                             "itself: use another draft (or --draft none and the ngram drafter)")
        _one_of(self.target_activations, Activations, "--target-activations")
        if self.target_activations == "int8" and not self.target_quant:
            raise ValueError("--target-activations int8 applies to a quantised target: add --quantize-target int4")
        if self.pad_decode and self.target_activations != "int8":
            raise ValueError("--pad-decode is for a target with int8 activations: add --quantize-target int4 "
                             "--target-activations int8 (float32 activations speculate without it)")
        if (self.target_activations == "int8" and not self.pad_decode and self.attention in (None, "fused")
                and self.draft.kind != "none"):
            raise ValueError("a target with int8 activations decodes plainly only unless built with --pad-decode "
                             "(a verify call would score tokens differently from plain decoding, so speculation "
                             "would not be lossless): add --pad-decode, use --draft none, or --target-activations "
                             "float32 to keep speculative decoding")
        if not self.tolerance > 0:
            raise ValueError(f"--tolerance must be > 0, got {self.tolerance}")
        _one_of(self.engine, Engine, "--engine", "tensorrt (or left out)")
        _one_of(self.attention, Attention, "--attention")
        if self.engine and self.attention not in (None, "portable"):
            raise ValueError("--engine tensorrt needs --attention portable: TensorRT has no GroupQueryAttention, "
                             "and its engines take the portable graph's inputs")
        if (not self.batch_sizes or any(not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= 256
                                        for b in self.batch_sizes) or 1 not in self.batch_sizes):
            raise ValueError(f"--batch values must be integers in [1, 256] including 1, got {list(self.batch_sizes)}")
        _one_of(self.engine_precision, Precision, "--engine-precision", "fp32, fp16 or bf16")
        if not (isinstance(self.mixed_groups, int) and not isinstance(self.mixed_groups, bool)
                and 0 <= self.mixed_groups <= 4):
            raise ValueError(f"--mixed-groups must be an integer in [0, 4], got {self.mixed_groups!r}")

        if not (isinstance(self.seed_tokens, int) and not isinstance(self.seed_tokens, bool)
                and 0 <= self.seed_tokens <= 4096):
            raise ValueError(f"--seed-tokens must be an integer in [0, 4096], got {self.seed_tokens!r}")

    def resolved(self) -> "BuildConfig":
        """This config with the defaults that depend on other options filled in: the attention kind and the
        long prefill profiles."""
        long = self.long_prefill
        if long is None:  # a capacity too small for them (test bundles) builds none
            long = tuple(t for t in LONG_PREFILL if self.prefill_chunk < t <= self.capacity // 2)
        return dataclasses.replace(self, attention=self.attention or ("portable" if self.engine else "fused"),
                                   long_prefill=tuple(sorted(set(long))))


class ParityError(RuntimeError):
    pass


def replaceable(out: Path) -> bool:
    """Whether --force may replace `out`: a directory (not a link to one) that is empty or holds a manifest."""
    if out.is_symlink() or not out.is_dir():
        return False
    return (out / bundle.MANIFEST).is_file() or not any(out.iterdir())


def build(cfg: BuildConfig, log=None, progress: bool = False) -> Manifest:
    """Build the bundle into a work directory beside cfg.out and move it there complete (exporter/output.py:
    stale leftovers, the atomic --force swap, signals, permissions, disk errors). `log` takes the build's
    lines (default: this module's logger at INFO); `progress`: tqdm bars on stderr over the long stages."""
    cfg = cfg.resolved()
    bars = Bars(progress)
    log = bars.writer(log or logger.info)
    out = Path(cfg.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        output.clean_stale(out, log)
        if os.path.lexists(out) and not cfg.force:
            raise FileExistsError(f"{out} already exists: pass --force to replace it, or choose another --out")
        if os.path.lexists(out) and not replaceable(out):
            raise FileExistsError(f"{out} is not a bundle (no {bundle.MANIFEST}) nor an empty directory: --force "
                                  "replaces only those; remove it yourself or choose another --out")
        if cfg.engine:  # before minutes of export: say now that TensorRT or the GPU is missing
            from .tensorrt import environment

            environment()
        umask = output.current_umask()
        with output.interrupts_as_keyboard_interrupt(), output.workdir(out) as work:
            root = work / "bundle"
            root.mkdir()
            with output.temp_env(work / "tmp"), third_party_quiet():
                manifest = _build_into(cfg, root, log, bars)
            manifest = _seal(root, manifest, umask)
            output.move_into_place(root, out, work)
        return manifest
    except (SpecExportError, ValueError, ParityError):
        raise
    except Exception as e:  # a full disk surfaces as OSError, or as an exporter error wrapping one (or none)
        err = output.write_error(e, out)
        if err is None:
            raise
        raise err from None
    finally:
        bars.close()  # a bar left by a failed stage, before the error is printed


def _seal(root: Path, m: Manifest, umask: int) -> Manifest:
    """Record each file's size in the manifest, set permissions, sync, and read the bundle back through the
    loader's own check (bundle.read, hashes included): a build never leaves a bundle the loader refuses."""
    m = dataclasses.replace(m, sizes={f: (root / f).stat().st_size for f in m.files})
    (root / bundle.MANIFEST).write_text(m.to_json())
    output.settle(root, umask)
    try:
        return bundle.read(root)
    except BundleError as e:
        raise BuildError(f"this build wrote a bundle its own loader refuses ({e}): a bug in specexport, "
                         "please report it") from None


@dataclass(frozen=True)
class ModelJob:
    """One model of the bundle to export (or quantise from an exported graph) and check."""
    role: str  # "target" | "draft"
    kind: str  # "checkpoint" | "early-exit" | "int4" | "int8"
    source: dict
    hf: object  # the transformers model: parity reference (and weights when not quantised)
    gc: object  # GraphConfig
    profiles: dict
    layers: int | None = None  # early exit: the reference's first layers
    quant_of: str | None = None  # quantise this already exported role's graph instead of exporting
    graph_file: str | None = None
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations, 1 = float32


def _load(name: str, log):
    import torch
    from transformers import AutoModelForCausalLM

    from . import models

    path = models.resolve(name)
    t = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    log(f"  loaded {name} from {path} ({time.perf_counter() - t:.1f} s)")
    return Path(path).resolve(), hf


def _export(cfg: BuildConfig, root: Path, job: ModelJob, log) -> ModelEntry:
    """Write the job's graph into root -> its entry (parity not yet filled in)."""
    from ..graphs import llama
    from . import onnx

    graph_file = job.graph_file or f"{job.role}.onnx"
    if job.quant_of is None:
        log(f"[{job.role}] exporting {job.gc.num_layers}-layer graph (B, T symbolic, S={cfg.capacity}) ...")
        onnx.export(llama.build(job.gc, job.hf.state_dict()), cfg.capacity, root / graph_file, attention=cfg.attention)
    else:
        log(f"[{job.role}] weight-only {job.kind} copy of {job.quant_of} (onnxruntime MatMulNBits, accuracy level "
            f"{job.accuracy_level}) ...")
        onnx.quantize(root / f"{job.quant_of}.onnx", root / graph_file, bits=int(job.kind[3:]),
                      accuracy_level=job.accuracy_level)
    inputs, outputs = onnx.io_spec(job.gc, attention=cfg.attention)
    return ModelEntry(role=job.role, kind=job.kind, source=job.source, arch=job.gc.summary(), graph=graph_file,
                      weights=graph_file + ".data", profiles=job.profiles, inputs=inputs, outputs=outputs, parity={},
                      parity_tolerance=None if job.quant_of else cfg.tolerance, attention=cfg.attention,
                      pad_decode=job.role == "target" and bool(job.quant_of) and cfg.pad_decode)


def _check(cfg: BuildConfig, root: Path, job: ModelJob, entry: ModelEntry, log, step) -> ModelEntry:
    """Every profile (and the largest batch, for the target) against transformers eager; for the target, a
    verify call against decode calls (losslessness) -> the entry with its parity report and verify drift."""
    from ..backends.ort import OrtBackend
    from . import parity

    backend = OrtBackend(root, entry, bundle.buckets_for(cfg.capacity), batch_sizes=sorted(cfg.batch_sizes))
    rep = parity.check(job.hf, backend, layers=job.layers, tick=step)
    if job.role == "target" and max(cfg.batch_sizes) > 1:  # rows at different cache lengths, row by row
        step(f"batch B={max(cfg.batch_sizes)}")
        rep.update(parity.check_batch(job.hf, backend, max(cfg.batch_sizes), layers=job.layers))
    for name, r in rep.items():
        log(f"  {name:16s} T={r['T']:<3d} S={r['S']:<5d} max|dlogit| {r['max_abs']:.2e}  top-1 agreement {r['top1']:.2f}")
    worst = max(r["max_abs"] for r in rep.values())
    if job.quant_of is None and not worst <= cfg.tolerance:
        raise ParityError(f"{job.role}: exported graph differs from transformers eager by {worst:.3g} > tolerance "
                          f"{cfg.tolerance:g}; the export is wrong for this checkpoint (report it), or "
                          "raise --tolerance if the difference is expected")
    if job.role != "target":
        return dataclasses.replace(entry, parity=rep)
    step("verify drift")
    chain, tree = parity.verify_drifts(backend)  # does a verify call score tokens as plain decoding does? (losslessness)
    drift = max(chain, tree)
    log(f"  one verify call vs one decode call per token: max|dlogit| {chain:.2e} (chain), {tree:.2e} (tree)")
    int8 = bool(job.quant_of) and job.accuracy_level == 4  # a quantised target with int8 activations
    if not int8 and not drift <= cfg.tolerance:
        raise ParityError(f"target: a verify call scores tokens differently from plain decoding by {drift:.3g} > "
                          f"tolerance {cfg.tolerance:g}; speculative output would not match plain decoding (report it)")
    if int8:  # chains may be exact where trees are not (see the quant block)
        return dataclasses.replace(entry, parity=rep, verify_drift=drift,
                                   # fused without the pad: T = 1 rows take another kernel, whatever
                                   # one measurement shows (a small model may not cascade)
                                   speculative=chain <= cfg.tolerance and (cfg.pad_decode or cfg.attention != "fused"),
                                   exact_trees=tree <= cfg.tolerance)
    return dataclasses.replace(entry, parity=rep, verify_drift=drift)


def _export_and_check(cfg: BuildConfig, root: Path, job: ModelJob, timings: dict, log, bars: Bars) -> ModelEntry:
    target = job.role == "target"
    bars.start(f"[{job.role}]", 1 + len(job.profiles) + 1 + (target and max(cfg.batch_sizes) > 1) + target)
    bars.step(f"[{job.role}] {'export' if job.quant_of is None else 'quantise'}")
    t = time.perf_counter()
    entry = _export(cfg, root, job, log)
    timings[f"{job.role}_export_s"] = round(time.perf_counter() - t, 1)
    log(f"  {timings[f'{job.role}_export_s']:.1f} s")
    t = time.perf_counter()
    log(f"[{job.role}] parity vs transformers eager on profiles {job.profiles} ...")
    entry = _check(cfg, root, job, entry, log, lambda name: bars.step(f"[{job.role}] parity {name}"))
    timings[f"{job.role}_parity_s"] = round(time.perf_counter() - t, 1)
    bars.close()
    log(f"  {timings[f'{job.role}_parity_s']:.1f} s")
    return entry


def _mixed(cfg: BuildConfig, root: Path, job: ModelJob, entry: ModelEntry, timings: dict, log) -> ModelEntry:
    """Export the target's mixed graph beside its fused graph, on the same weights file, and check its calls
    against the fused graph's own (which the parity check just held against transformers)."""
    from ..backends.ort import OrtBackend
    from ..graphs import llama
    from . import onnx, parity

    t = time.perf_counter()
    name = "target.mixed.onnx"
    log(f"[target] exporting the mixed graph (a batch + {cfg.mixed_groups} group(s) per call) ...")
    onnx.export_mixed(llama.build(job.gc, job.hf.state_dict()), cfg.capacity, root / name, cfg.mixed_groups)
    onnx.share_weights(root / name, root / entry.graph)
    entry = dataclasses.replace(entry, mixed={"graph": name, "groups": cfg.mixed_groups, "max_abs": 0.0})
    backend = OrtBackend(root, entry, bundle.buckets_for(cfg.capacity), batch_sizes=sorted(cfg.batch_sizes))
    worst = parity.check_mixed(backend)
    log(f"  mixed calls vs the fused graph's calls: max|dlogit| {worst:.2e} ({time.perf_counter() - t:.1f} s)")
    timings["target_mixed_s"] = round(time.perf_counter() - t, 1)
    if not worst <= cfg.tolerance:
        raise ParityError(f"target: the mixed graph differs from the fused graph by {worst:.3g} > tolerance "
                          f"{cfg.tolerance:g} (report it), or build with --mixed-groups 0")
    return dataclasses.replace(entry, mixed={**entry.mixed, "max_abs": worst})


def _draft_job(cfg: BuildConfig, t_path: Path, t_hf, t_gc, log) -> ModelJob | None:
    from ..graphs import config as gconfig
    from .tokenizer import check_compatible

    d = cfg.draft
    profiles = {"decode": 1, "catchup": 2, "prefill": cfg.prefill_chunk}
    if d.kind == "checkpoint":
        d_path, d_hf = _load(d.source, log)
        check_compatible(t_path, d_path, t_gc.vocab_size, d_hf.config.vocab_size)
        return ModelJob("draft", "checkpoint", {"name": d.source, "path": str(d_path)}, d_hf,
                        gconfig.from_hf(d_hf), profiles)
    if d.kind == "early-exit":
        return ModelJob("draft", "early-exit", {"name": cfg.target, "layers": d.layers}, t_hf,
                        t_gc.with_layers(d.layers), profiles, layers=d.layers)
    if d.kind in ("int4", "int8"):
        return ModelJob("draft", d.kind, {"name": cfg.target, "quantised": d.kind}, t_hf, t_gc, profiles,
                        quant_of="target")
    return None


def _build_into(cfg: BuildConfig, root: Path, log, bars: Bars) -> Manifest:
    import torch

    from ..graphs import config as gconfig
    from .tokenizer import copy_tokenizer

    t_start = time.perf_counter()
    torch.manual_seed(0)
    timings: dict = {}
    t_path, t_hf = _load(cfg.target, log)
    t_gc = gconfig.from_hf(t_hf)
    target_profiles = {"decode": 1, "prefill": cfg.prefill_chunk, **{f"prefill_{t}": t for t in cfg.long_prefill},
                       **{f"verify_{k}": k + 1 for k in sorted(cfg.ks)}}
    target = ModelJob("target", "checkpoint", {"name": cfg.target, "path": str(t_path)}, t_hf, t_gc, target_profiles)
    entries = {"target": _export_and_check(cfg, root, target, timings, log, bars)}
    if cfg.mixed_groups and cfg.attention == "fused" and not cfg.target_quant and max(cfg.batch_sizes) > 1:
        entries["target"] = _mixed(cfg, root, target, entries["target"], timings, log)
    draft = _draft_job(cfg, t_path, t_hf, t_gc, log)
    if draft is not None:
        entries["draft"] = _export_and_check(cfg, root, draft, timings, log, bars)
    if cfg.target_quant:  # after the drafts: a self:int4/int8 draft is cut from the float32 target graph
        # float32 activations (level 1) keep speculation lossless. int8 (level 4) quantises each row's activations,
        # so float32 rounding differences cascade: GroupQueryAttention's T = 1 kernel sums in another order than
        # its T >= 2 one (SmolLM2 int4: verify rows 0.3-0.9 logits from 1-token decode calls). --pad-decode gives
        # every 1-token call a pad token; then a chain's verify rows are bit-identical to decode rows and chain
        # drafts stay lossless. A tree's are not (softmax sums a branch's keys in other vector lanes than
        # decoding does; ~0.6 logits on SmolLM2), so recycle drafts its best path only. The drift check decides
        # (`_check`): a chain beyond the tolerance marks the target plain-only.
        fp32, int8 = entries["target"], cfg.target_activations == "int8"
        q = _export_and_check(cfg, root, dataclasses.replace(
            target, kind=cfg.target_quant, source={**fp32.source, "quantised": cfg.target_quant}, quant_of="target",
            graph_file=f"target.{cfg.target_quant}.onnx", accuracy_level=4 if int8 else 1), timings, log, bars)
        entries["target"] = dataclasses.replace(q, float32_graph_parity=fp32.parity, activations=cfg.target_activations)
        if not entries["target"].speculative and "draft" in entries:
            raise ParityError(f"target: with int8 activations a verify call scores tokens differently from plain "
                              f"decoding by {q.verify_drift:.3g} > tolerance {cfg.tolerance:g}, so the bundle "
                              "decodes plainly only: build it with --draft none, or --target-activations float32")
        if entries["target"].speculative and not entries["target"].exact_trees:
            log("  (a chain's verify rows score exactly as decoding, a tree's do not: recycle drafts chains)")
        (root / "target.onnx").unlink()
        (root / "target.onnx.data").unlink()
    if cfg.engine:
        from .tensorrt import build_engine

        for role, e in list(entries.items()):
            entries[role] = dataclasses.replace(e, engine=build_engine(root, e, bundle.buckets_for(cfg.capacity),
                                                                       cfg.engine_precision, log))
    tok = copy_tokenizer(t_path, root / "tokenizer", t_hf)
    timings["total_s"] = round(time.perf_counter() - t_start, 1)
    m = _write_manifest(cfg, root, entries, tok, timings)
    if cfg.seed_tokens and m.target.speculative:  # the runtime on the bundle as written: its manifest first
        from .seed import seed

        t = time.perf_counter()
        info = seed(root, cfg.seed_tokens, log)
        timings["seed_s"] = round(time.perf_counter() - t, 1)
        timings["total_s"] = round(time.perf_counter() - t_start, 1)
        m = dataclasses.replace(m, files={**m.files, info["file"]: bundle.sha256(root / info["file"])},
                                successors=info, build={**m.build, "seed_tokens": cfg.seed_tokens, "timings": timings})
        (root / bundle.MANIFEST).write_text(m.to_json())
    log(f"built in {timings['total_s']:.0f} s, {sum((root / f).stat().st_size for f in m.files) / 1e6:.0f} MB")
    return m


def _write_manifest(cfg: BuildConfig, root: Path, entries: dict, tok: dict, timings: dict) -> Manifest:
    """manifest.json: every file of root hashed, the build's options and timings."""
    S = cfg.capacity
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    m = Manifest(
        specexport_version=__version__, capacity=S, batch=max(cfg.batch_sizes), batch_sizes=sorted(cfg.batch_sizes),
        buckets=bundle.buckets_for(S), models=entries, tokenizer=tok,
        files={f: bundle.sha256(root / f) for f in files},
        build={"target": cfg.target, "draft": dataclasses.asdict(cfg.draft), "ks": sorted(cfg.ks), "capacity": S,
               "batch_sizes": sorted(cfg.batch_sizes), "target_quant": cfg.target_quant, "engine": cfg.engine,
               "attention": cfg.attention, "prefill_chunk": cfg.prefill_chunk,
               "long_prefill": list(cfg.long_prefill), "tolerance": cfg.tolerance,
               "timings": timings, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "kv_layout": "inputs past_key.{i}/past_value.{i} [B,Hkv,S,D] per layer, keys rotated; "
                            "output new_kv [L,2,B,Hkv,T,D]; slot = position mod S"
                            + ("; fused: present_key/value.{i} alias the past buffers (slots n..n+T-1 written)"
                               if cfg.attention == "fused" else "")})
    (root / bundle.MANIFEST).write_text(m.to_json())
    return m
