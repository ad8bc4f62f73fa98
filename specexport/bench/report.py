"""For people: the per-question mode's Spec-Bench-style table, per-step timings, memory floor, identity and
noise notes (summary.md), and the speedup plot (speedup.png). Reads records only; runs nothing."""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from . import machine
from .config import BenchConfig


def step_bytes(graph: Path) -> int:
    """Weight bytes one decode step reads: every initializer, except those only gathered from (an untied
    embedding table: one row per token). A quantised target keeps its float32 embedding for the lookup."""
    import onnx

    g = onnx.load(str(graph), load_external_data=False).graph
    users: dict = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, set()).add(n.op_type)
    total = 0
    for t in g.initializer:
        if users.get(t.name, set()) <= {"Gather"}:
            continue
        ext = {e.key: e.value for e in t.external_data}
        total += int(ext["length"]) if "length" in ext else len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes
    return total


def tokens_per_s(records: list[dict], meth: str, cat: str | None = None) -> float:
    """Total tokens / total seconds of one method (in one category, or overall)."""
    rs = [r for r in records if r["method"] == meth and (cat is None or r["category"] == cat)]
    return sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)


def noise_lines(records: list[dict], limit: float) -> list[str]:
    """Warnings for samples whose repeats spread more than `limit`, and for a bandwidth probe that moved more
    than that over the run (the machine's load changed: compare ratios within the run only)."""
    lines = []
    rep = [r for r in records if "spread" in r]
    bad = [r for r in rep if r["spread"] > limit]
    if bad:
        worst = max(bad, key=lambda r: r["spread"])
        lines.append(f"**Noisy samples**: {len(bad)} of {len(rep)} (question, method) samples spread more than "
                     f"{limit:.0%} over their {len(worst['seconds_runs'])} runs (worst: {worst['method']} on "
                     f"q{worst['question_id']}, {worst['spread']:.0%}); the table keeps medians.")
    bw = sorted(r["bandwidth_gbs"] for r in records if "bandwidth_gbs" in r)
    if bw and (bw[-1] - bw[0]) / statistics.median(bw) > limit:
        lines.append(f"**Noisy machine**: the bandwidth probe ranged {bw[0]:.1f}-{bw[-1]:.1f} GB/s over the run "
                     f"(more than {limit:.0%} of its median): read ratios within this run, not absolute speeds.")
    if any(r.get("repeats_identical") is False for r in records):
        lines.append("Some repeats gave other tokens than their first run: " + ", ".join(sorted(
            {r["method"] for r in records if r.get("repeats_identical") is False})))
    return lines


def header(cfg: BenchConfig, info: dict | None) -> list[str]:
    info = info or {}
    lines = [f"Machine: {machine.label()}; {cfg.threads} threads. Questions: {info.get('questions', cfg.questions)}."]
    v = info.get("versions")
    if v:
        lines.append("Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".")
    for meth, p in (info.get("peers") or {}).items():
        d = p.get("device_defaults", {})
        lines.append(f"{meth}: OpenVINO IR {p['model']}, properties {p['properties']}"
                     f"{', prompt lookup ' + str(p['prompt_lookup']) if p.get('prompt_lookup') else ''}"
                     f"{', prefix caching off' if p.get('prefix_caching') is False else ''}; the CPU "
                     f"plugin's defaults here: inference {d.get('INFERENCE_PRECISION_HINT')}, KV cache "
                     f"{d.get('KV_CACHE_PRECISION')}, dynamic quantization group "
                     f"{d.get('DYNAMIC_QUANTIZATION_GROUP_SIZE')}.")
    if cfg.extra_bundles:
        from .config import extra_bundle

        lines.append("Bundles of the @TAG methods: " + ", ".join(
            f"@{t} = {p} on {b}" for t, p, b in map(extra_bundle, cfg.extra_bundles)) + ".")
    if info.get("skipped"):
        lines.append("Skipped (not installed or no model here): " + ", ".join(info["skipped"]) + ".")
    return lines + [""]


def summarize(records: list[dict], cfg: BenchConfig, info: dict | None = None) -> str:
    meths = list(dict.fromkeys(r["method"] for r in records))
    cats = list(dict.fromkeys(r["category"] for r in records))
    ref = meths[0]

    def cell(meth, cat=None):
        rs = [r for r in records if r["method"] == meth and (cat is None or r["category"] == cat)]
        tau = [r["tau"] for r in rs if "tau" in r]
        t = tokens_per_s(records, meth, cat)
        same = [r["identical"] for r in rs if r["identical"] is not None]
        base = tokens_per_s(records, ref, cat)  # 0 when the reference stopped at once on every such question
        return t, f"{t / base:.2f}x" if base else "-", (statistics.mean(tau) if tau else None), \
            ("yes" if all(same) else "NO") if same else "n/a"

    mode = (f"sampled (temperature {cfg.temperature}, top-p {cfg.top_p}, seed {cfg.seed}; identical: against the "
            "first specexport method on the same bundle)" if cfg.temperature else "greedy")
    reps = f", median of {cfg.repeats} runs each" if cfg.repeats > 1 else ""
    lines = header(cfg, info) + [
        f"Speedup over `{ref}` (tokens/s ratio, totals per category) and mean accepted tokens per target "
        f"step (tau); {len(records) // len(meths)} questions, {cfg.max_new_tokens} new tokens, {mode}, "
        f"batch 1, {cfg.threads} threads{reps}.", "",
        "| method | " + " | ".join(cats) + " | overall | tokens/s | tau | identical |",
        "|---|" + "---|" * (len(cats) + 4)]
    for meth in meths:
        row = [cell(meth, c)[1] for c in cats]
        t, s, tau, same = cell(meth)
        lines.append(f"| {meth} | " + " | ".join(row) + f" | **{s}** | {t:.1f} | "
                     f"{'' if tau is None else f'{tau:.2f}'} | {same} |")
    se = [r for r in records if r["method"].startswith("se-") and r.get("steps")]
    if se:
        lines += ["", "| method | ms per target step (inside ORT) | draft ms per step | host % of time | acceptance |",
                  "|---|---|---|---|---|"]
        for meth in [x for x in meths if x.startswith("se-")]:
            rs = [r for r in se if r["method"] == meth]
            if not rs:
                continue
            steps = sum(r["steps"] for r in rs)
            lines.append(f"| {meth} | {1e3 * sum(r['verify_s'] for r in rs) / steps:.1f} | "
                         f"{1e3 * sum(r['draft_s'] for r in rs) / steps:.1f} | "
                         f"{100 * sum(r['host_s'] for r in rs) / sum(r['seconds'] for r in rs):.1f}% | "
                         f"{statistics.mean(r['acceptance'] for r in rs):.2f} |")
    probes = sorted({r["bandwidth_gbs"] for r in records if "bandwidth_gbs" in r})
    if probes:
        from ..bundle import read

        size = step_bytes(Path(cfg.bundle) / read(cfg.bundle, verify=False).target.graph)
        bw = statistics.median(probes)
        floor = size / bw / 1e6
        lines += ["", f"Memory floor: {size / 1e6:.0f} MB of target weights per decode step / {bw:.1f} GB/s "
                      f"(numpy read, {cfg.threads} threads; median of {len(probes)} probes, one per question, "
                      f"range {probes[0]:.1f}-{probes[-1]:.1f}) = {floor:.1f} ms per token."]
        plain = [r for r in se if r["method"] == "se-none"]
        if plain:
            ms = 1e3 * sum(r["verify_s"] for r in plain) / sum(r["steps"] for r in plain)
            lines.append(f"Plain decode step (se-none, inside ORT): {ms:.1f} ms = {ms / floor:.2f}x the floor.")
    bad = [r for r in records if r["identical"] is False]

    def same_bundle(r):
        return r.get("reference", meths[0]).partition("@")[2] == r["method"].partition("@")[2]

    ours = [r for r in bad if r["method"].startswith("se-") and same_bundle(r)]
    if ours:
        lines += ["", "Not token-identical to the plain decoding of the same bundle: " + ", ".join(
            f"{r['method']} on q{r['question_id']}" for r in ours)]
    peers = {m: sum(r["method"] == m for r in bad if r not in ours) for m in meths}
    if any(peers.values()):
        lines += ["", f"Other models differing from the reference {meths[0]} (questions): " + ", ".join(
            f"{m} {n}/{len(records) // len(meths)}" for m, n in peers.items() if n)]
    noise = noise_lines(records, cfg.noise)
    return "\n".join(lines + ([""] + noise if noise else []))


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meths = list(dict.fromkeys(r["method"] for r in records))
    cats = list(dict.fromkeys(r["category"] for r in records))
    ref = meths[0]

    def sp(meth, cat):  # 0 where the reference emitted nothing (no bar)
        base = tokens_per_s(records, ref, cat)
        return tokens_per_s(records, meth, cat) / base if base else 0.0

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(16, 5), gridspec_kw={"width_ratios": [3, 1]})
    w = 0.8 / len(meths)
    for i, meth in enumerate(meths):
        ax.bar(np.arange(len(cats)) + i * w, [sp(meth, c) for c in cats], w, label=meth)
    ax.set_xticks(np.arange(len(cats)) + 0.4 - w / 2, cats, rotation=30, ha="right")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_ylabel(f"speedup over {ref}")
    ax.set_title(machine.label(), fontsize=8)
    ax.legend(fontsize=7, ncol=2)
    for meth in [x for x in meths if x.startswith("se-") and x != "se-none"]:
        hs = [r["hist"] for r in records if r["method"] == meth and r.get("hist")]
        if hs:
            n = max(9, *map(len, hs))
            h = np.sum([np.pad(x, (0, n - len(x))) for x in hs], axis=0)
            ax2.plot(np.arange(len(h)), h / h.sum(), marker="o", label=meth)
    ax2.set_xlabel("drafts accepted per step")
    ax2.set_ylabel("fraction of steps")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
