"""The concurrency mode (`--concurrency 1,2,4,8,16`): many requests at once on one loaded bundle.

For each concurrency level and method, Spec-Bench prompts go to the batching engine (`Pipeline.submit`, at
most `level` decoding together) as a burst or as Poisson arrivals (`--arrival poisson --rate R`), each
request consumed by its own thread as a client would. Measured per request: time to first token (submit ->
first text piece) and time per output token after it; per run: aggregate tokens/s (all new tokens / wall
time from the first submit to the last finish), the engine's batch sizes and pool bytes, the RSS of the process
that ran it.
Every output is checked against the same request run alone (`Pipeline.generate`, plain decoding), which is
also the one-request baseline. OpenVINO GenAI's ContinuousBatchingPipeline (`ov-cb[-int4][-default][-pld]`)
runs the same requests at the same concurrency (at most `level` added to it at a time) as the peer, each run
in a child process of its own (`Load.openvino`).
With --repeats N each level runs the methods N times, in an order rotated by one every repeat (plain, auto,
k4, then auto, k4, plain, ...), so that no method always runs first or always follows the same one.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from . import machine
from .config import BenchConfig, extra_bundle, find_questions, parse_se, questions
from .peers import OV_PLD, ov_device_defaults, ov_spec
from .runner import runnable, sha1, spread

OV_CACHE_GB = 2  # the OpenVINO scheduler's KV cache: 16 requests of ~1k tokens at float32 fit


def arrival_times(n: int, cfg: BenchConfig) -> list[float]:
    """Seconds after the start at which each request is submitted: all at 0 (burst), or a Poisson process
    of `cfg.rate` requests per second (exponential gaps, seeded), the first at 0."""
    if cfg.arrival == "burst":
        return [0.0] * n
    gaps = np.random.default_rng(cfg.seed).exponential(1.0 / cfg.rate, n)
    return [0.0] + np.cumsum(gaps[:-1]).tolist()


def rss_mb() -> float:
    """This process's resident memory now (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


class Load:
    def __init__(self, cfg: BenchConfig, log: Callable[[str], None]):
        import specexport

        self.cfg, self.log = cfg, log
        self.pipe = specexport.load(cfg.bundle, threads=cfg.threads)
        self.pipes = {"": self.pipe}  # bundle tag -> pipeline (se-...@TAG: --extra-bundle TAG=PATH)
        for spec in cfg.extra_bundles:
            tag, path, backend = extra_bundle(spec)
            self.pipes[tag] = specexport.load(path, threads=cfg.threads, backend=backend)
        self.eos = self.pipe.eos
        self.biggest = max(self.pipe.manifest.batch_sizes)
        self.sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
        self.ov_info: dict = {}

    def strip(self, ids) -> list[int]:
        ids = [int(t) for t in ids]
        return ids[:next((i for i, t in enumerate(ids) if t in self.eos), len(ids))]

    # ---- specexport: the batching engine
    def engine(self, meth: str, prompts: list, at: list[float], level: int) -> tuple[list[dict], dict]:
        draft, k, tag = parse_se(meth)
        pipe, n = self.pipes[tag], self.cfg.max_new_tokens
        biggest = max(pipe.manifest.batch_sizes)
        pipe.successors = pipe.fresh_table()  # each run starts from the bundle's seeded table (or an empty one)
        pipe.start_engine(max_batch=min(level, biggest), max_queue=len(prompts), prefill_budget=self.cfg.prefill_budget,
                          prefix_cache_mb=self.cfg.prefix_cache_mb)
        pipe.submit(prompts[0][:16], max_new_tokens=2, draft=draft, k=k, **self.sampling).wait()  # warm-up
        out: list = [None] * len(prompts)

        def consume(i, c, t_sub):
            first = None
            for _ in c:
                if first is None:
                    first = time.perf_counter()
            g = c.wait()
            end = time.perf_counter()
            out[i] = {"submit": t_sub, "first": first or end, "end": end, "tokens": self.strip(g.token_ids),
                      "finish_reason": g.finish_reason, "tau": g.stats.tau,
                      **({"error": repr(c.error)} if c.error else {})}

        threads = []
        t0 = time.perf_counter()
        for i, (ids, a) in enumerate(zip(prompts, at)):
            time.sleep(max(0.0, t0 + a - time.perf_counter()))
            t_sub = time.perf_counter()
            c = pipe.submit(ids, max_new_tokens=n, draft=draft, k=k, **self.sampling)
            threads.append(threading.Thread(target=consume, args=(i, c, t_sub), daemon=True))
            threads[-1].start()
        for th in threads:
            th.join()
        st = pipe.engine.stats()
        pipe.close()
        return out, {"t0": t0, "max_batch": min(level, biggest), "batch": st.get("batch"),
                     "pool_bytes": st.get("pool_peak_bytes"), "steps": st.get("steps"),
                     "prefill_batch": st.get("prefill_batch"), "prefill_budget": st.get("prefill_budget"),
                     "draft_batch": st.get("draft_batch"), "prefix_cache": st.get("prefix_cache")}

    # ---- OpenVINO GenAI: its continuous batching pipeline, in a child process
    def openvino(self, meth: str, prompts: list, at: list[float], level: int) -> tuple[list[dict], dict]:
        """One run of OpenVINO GenAI's ContinuousBatchingPipeline, in a child process of its own (`ov_run`), so
        that the peer and the engine share nothing but the machine: the RSS recorded for it is its own (in this
        process it was ours, the bundle's loaded graphs included), and nothing its CPU plugin leaves in a process
        (threads, allocator state) can touch the methods that run after it.
        Three ad-hoc probes here saw onnxruntime's calls 1.09-1.19x slower for as long as measured after an
        in-process compile, two recorded ones (experiments/ov_after_probe.py, 2026-12-07, `epyc-zen4`) saw no
        change beyond the machine's own 1.3x swings. The child's clock is this one's (time.perf_counter is
        CLOCK_MONOTONIC); the run's compile and warm-up are not timed, as before."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        spec = ov_spec(meth, self.cfg)
        job = {"model": str(spec["model"]), "props": spec["props"], "pld": spec["pld"], "level": level,
               "prefix_caching": self.cfg.prefix_cache_mb > 0, "prompts": prompts, "at": at,
               "max_new_tokens": self.cfg.max_new_tokens, "eos": sorted(self.eos),
               "temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "seed": self.cfg.seed}
        # spawn: no copy of this process's threads; a child that dies raises here (BrokenProcessPool), never hangs
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
            out, extra, info = ex.submit(ov_run, job).result()
        self.ov_info[meth] = info
        for r in out:
            r["tokens"] = self.strip(r["tokens"])
        return out, extra

    def solo(self, prompts: list, tag: str = "") -> list[tuple[list[int], float]]:
        """Each prompt alone through Pipeline.generate, plain decoding on the bundle tagged `tag`: the
        reference tokens and seconds. Taken after the pipeline's engine has started, in the state the engine
        runs its target in from then on (OpenVINO: the fixed-shape models dropped, whose bfloat16 kernels score
        some tokens differently from the dynamic model's; docs/design.md "The OpenVINO backend")."""
        pipe = self.pipes[tag]
        if hasattr(pipe.target, "step_batch"):  # a backend that batches (the others fail in `engine` anyway)
            pipe.start_engine(max_batch=1)
        pipe.generate(prompts[0][:16], max_new_tokens=2, draft="none")  # warm-up
        out = []
        for ids in prompts:
            t = time.perf_counter()
            g = pipe.generate(ids, max_new_tokens=self.cfg.max_new_tokens, draft="none", **self.sampling)
            out.append((self.strip(g.token_ids), time.perf_counter() - t))
        return out


def tps(runs: list) -> float:
    """Tokens per second over (tokens, seconds) runs."""
    return sum(len(t) for t, _ in runs) / sum(sec for _, sec in runs)


def ov_run(job: dict) -> tuple[list[dict], dict, dict]:
    """(in a child process, `Load.openvino`) The requests of `job` through OpenVINO GenAI's
    ContinuousBatchingPipeline at most job["level"] at a time, arriving at job["at"] -> (per request: submit,
    first and end times and the generated ids; {"t0", "max_batch", "rss_mb"}; what it ran, for the records)."""
    import openvino as ov
    import openvino_genai as og

    from ..backends.ov import same_sigaltstack

    sc = og.SchedulerConfig()
    sc.max_num_seqs, sc.cache_size, sc.dynamic_split_fuse = job["level"], OV_CACHE_GB, True
    sc.enable_prefix_caching = job["prefix_caching"]  # as ours: like for like
    props = {**job["props"], **({"prompt_lookup": True} if job["pld"] else {})}
    with same_sigaltstack():  # OpenVINO's compile leaves a signal stack it may unmap (backends/ov.py)
        p = og.ContinuousBatchingPipeline(job["model"], sc, "CPU", props)
    info = {"model": job["model"], "properties": job["props"], "prompt_lookup": OV_PLD if job["pld"] else None,
            "device_defaults": ov_device_defaults(), "kv_cache_gb": OV_CACHE_GB,
            "prefix_caching": sc.enable_prefix_caching, "process": "a child process of the bench's own"}

    def gc(n):
        g = og.GenerationConfig()
        g.max_new_tokens = n
        g.eos_token_id = min(job["eos"])
        g.stop_token_ids = set(job["eos"])
        if job["pld"]:
            g.num_assistant_tokens, g.max_ngram_size = OV_PLD["num_assistant_tokens"], OV_PLD["max_ngram_size"]
        if job["temperature"]:
            g.do_sample, g.temperature, g.top_p = True, job["temperature"], job["top_p"]
            g.rng_seed = job["seed"]
        return g

    def tensor(ids):
        return ov.Tensor(np.array([ids], dtype=np.int64))

    prompts, at, level = job["prompts"], job["at"], job["level"]
    h = p.add_request(10 ** 6, tensor(prompts[0][:16]), gc(2))  # warm-up
    while p.has_non_finished_requests():
        p.step()
    h.read_all()
    # its scheduler runs every added request at once (max_num_seqs does not cap that under dynamic
    # split-fuse), so the level is kept here: a request that has arrived waits until fewer than `level` run,
    # as one that our engine queues does; its time to first token counts the wait
    handles, sub, first, end = {}, {}, {}, {}
    i, n, waiting = 0, len(prompts), []
    t0 = time.perf_counter()
    while i < n or waiting or len(end) < len(handles):
        now = time.perf_counter()
        while i < n and t0 + at[i] <= now:
            waiting.append(i)
            sub[i], i = now, i + 1
        while waiting and len(handles) - len(end) < level:
            j = waiting.pop(0)
            handles[j] = p.add_request(j, tensor(prompts[j]), gc(job["max_new_tokens"]))
        if p.has_non_finished_requests():
            p.step()
        elif i < n:
            time.sleep(max(0.0, min(t0 + at[i] - time.perf_counter(), 0.005)))
        t = time.perf_counter()
        for j, hj in handles.items():
            if j in end:
                continue
            if j not in first and hj.can_read():
                first[j] = t
            if hj.get_status() != og.GenerationStatus.RUNNING or not p.has_non_finished_requests():
                end[j] = t
                first.setdefault(j, t)
    out = []
    for j in range(n):
        res = handles[j].read_all()
        out.append({"submit": sub[j], "first": first[j], "end": end[j],
                    "tokens": [int(t) for t in res[0].generated_ids] if res else [],
                    "finish_reason": str(handles[j].get_status()).rpartition(".")[2].lower()})
    return out, {"t0": t0, "max_batch": level, "rss_mb": rss_mb()}, info


def run_load(cfg: BenchConfig, log=print) -> tuple[list[dict], list[dict], dict]:
    """-> (one record per request, one aggregate per (level, method, repeat), run info)."""
    qpath = find_questions(cfg.questions)
    meths = list(runnable(cfg, log))
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    L = Load(cfg, log)
    qs = questions(qpath, cfg.per_category, cfg.limit)
    # the levels run the first --requests prompts (again from the first past the end), and the solo reference
    # runs those, not every selected question: the 52 of the default selection average 190 prompt tokens against
    # 74 for the first 16, and their solo plain rate was 0.88-0.91x the first 16's (more of it prefill),
    # which overstated every ratio to it by 1.10-1.14x (2026-12-06, `epyc-zen3`)
    qs = qs[:cfg.requests] if cfg.requests else qs
    prompts = [L.pipe.encode(q["turns"][0], chat=True) for q in qs]
    over = [c for c in cfg.concurrency if c > L.biggest]
    if over:
        log(f"the bundle batches at most {L.biggest} requests per target call: levels {over} run {L.biggest} "
            f"at a time (rebuild with --batch ...,{max(over)} for more); OpenVINO runs them all at once")
    log(f"{len(qs)} prompts, {cfg.max_new_tokens} new tokens, levels {list(cfg.concurrency)}, {cfg.arrival} "
        f"arrivals{f' at {cfg.rate}/s' if cfg.arrival == 'poisson' else ''}; {machine.label()}")
    solo = {"": L.solo(prompts)}  # bundle tag -> per prompt (tokens, seconds); the peers compare with ""
    for tag in dict.fromkeys(m.partition("@")[2] for m in meths if m.startswith("se-") and "@" in m):
        solo[tag] = L.solo(prompts, tag)
    log(f"solo plain decoding (the reference), before the levels: {tps(solo['']):.1f} tokens/s")
    cpu = machine.cpu()
    records, aggs = [], []
    with open(out / "records.jsonl", "w") as f, open(out / "aggregates.jsonl", "w") as fa:
        for level in cfg.concurrency:
            n_req = cfg.requests or max(len(prompts), level)
            order = [j % len(prompts) for j in range(n_req)]
            at = arrival_times(n_req, cfg)
            for rep in range(cfg.repeats):
                # the order rotates each repeat: on a shared machine whose speed drifts over minutes, a method
                # always run first (a fresh engine right after the level's start) or always after the same one
                # carried that place's luck into every repeat of the comparison
                for meth in meths[rep % len(meths):] + meths[:rep % len(meths)]:
                    drive = L.engine if meth.startswith("se-") else L.openvino
                    res, extra = drive(meth, [prompts[j] for j in order], at, level)
                    t0 = extra.pop("t0")
                    rows = []
                    ref = solo[meth.partition("@")[2] if meth.startswith("se-") else ""]
                    for i, (pi, r) in enumerate(zip(order, res)):
                        n = len(r["tokens"])
                        row = {"mode": "concurrency", "concurrency": level, "arrival": cfg.arrival, "rate": cfg.rate,
                               "repeat": rep, "method": meth, "request": i, "question_id": qs[pi]["question_id"],
                               "category": qs[pi]["category"], "prompt_tokens": len(prompts[pi]), "new_tokens": n,
                               "submit_s": r["submit"] - t0, "ttft_s": r["first"] - r["submit"],
                               "tpot_s": (r["end"] - r["first"]) / (n - 1) if n > 1 else None,
                               "latency_s": r["end"] - r["submit"], "identical": r["tokens"] == ref[pi][0],
                               "output_sha1": sha1(r["tokens"]), "finish_reason": r["finish_reason"],
                               **{k: r[k] for k in ("tau", "error") if k in r},
                               "cpu": cpu["model"], "cpu_flags": " ".join(cpu["flags"])}
                        rows.append(row)
                        f.write(json.dumps(row) + "\n")
                    wall = max(r["end"] for r in res) - t0
                    agg = {"concurrency": level, "method": meth, "repeat": rep, "requests": len(rows),
                           "new_tokens": sum(r["new_tokens"] for r in rows), "wall_s": wall,
                           "tokens_per_s": sum(r["new_tokens"] for r in rows) / wall,
                           "identical": sum(r["identical"] for r in rows), "rss_mb": rss_mb(), **extra,
                           "cpu": cpu["model"], "cpu_flags": " ".join(cpu["flags"])}
                    fa.write(json.dumps(agg) + "\n")
                    records += rows
                    aggs.append(agg)
                    tt = [r["ttft_s"] for r in rows]
                    log(f"c={level} {meth}: {agg['tokens_per_s']:.1f} tokens/s, TTFT p50 {pct(tt, 50):.2f} s, "
                        f"{agg['identical']}/{len(rows)} identical to solo")
    # the reference again, after the levels: this machine class's memory speed drifts within a run (one
    # measurement at the start was 1.25x the engine's own one-request speed minutes later), so the ratios
    # divide by both passes' tokens over both passes' seconds; the tokens must repeat exactly
    after = L.solo(prompts)
    if [t for t, _ in after] != [t for t, _ in solo[""]]:
        log("the solo runs after the levels did not repeat the first ones' tokens")
    solo_tps = tps(solo[""] + after)
    log(f"solo plain decoding after the levels: {tps(after):.1f} tokens/s; the reference: {solo_tps:.1f}")
    info = {"methods": meths, "skipped": [x for x in cfg.methods if x not in meths], "questions": str(qpath),
            "machine": cpu, "versions": machine.versions(), "peers": L.ov_info, "solo_tokens_per_s": solo_tps,
            "solo_before_after_tokens_per_s": [tps(solo[""]), tps(after)],
            "solo_seconds": sum(s for _, s in solo[""] + after), "solo_prompts": len(prompts),
            "batch_sizes": {tag or "main": p.manifest.batch_sizes for tag, p in L.pipes.items()}}
    return records, aggs, info


def summarize_load(records: list[dict], aggs: list[dict], cfg: BenchConfig, info: dict) -> str:
    from .report import header

    solo = info["solo_tokens_per_s"]
    lines = header(cfg, info) + [
        f"Concurrency: {len({r['request'] for r in records})} requests per level at most, {cfg.max_new_tokens} "
        f"new tokens, {'greedy' if not cfg.temperature else f'sampled (temperature {cfg.temperature})'}, "
        f"{cfg.arrival} arrivals{f' at {cfg.rate} requests/s' if cfg.arrival == 'poisson' else ''}; bundle batch "
        f"sizes {info['batch_sizes']}. Baseline: each request alone, plain decoding = {solo:.1f} tokens/s"
        + (" ({:.1f} before the levels, {:.1f} after). ".format(*info["solo_before_after_tokens_per_s"])
           if "solo_before_after_tokens_per_s" in info else ". ") +
        "TTFT: submit -> first text piece; TPOT: seconds per output token after the first. Identical: "
        "tokens == the same request run alone." + (f" Median of {cfg.repeats} runs." if cfg.repeats > 1 else "")
        + (f" Prefix cache {cfg.prefix_cache_mb:g} MB (OpenVINO CB: its prefix caching on); the solo baseline "
           "prefills every prompt whole." if cfg.prefix_cache_mb else " No prefix cache (OpenVINO CB's off too)."),
        "Steps: the engine's decode and verify calls of the target; draft calls: the draft model's; medians over "
        "the runs (two methods that made the same calls differ in tokens/s by the machine's spread alone).",
        "", "| concurrency | method | tokens/s | vs solo plain | TTFT p50 s | TTFT p99 s | TPOT p50 ms | "
            "TPOT p99 ms | identical | steps | draft calls | pool MB | RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    noisy = []
    for level, meth in dict.fromkeys((a["concurrency"], a["method"]) for a in aggs):
        ag = [a for a in aggs if a["concurrency"] == level and a["method"] == meth]
        rs = [r for r in records if r["concurrency"] == level and r["method"] == meth]
        tps = [a["tokens_per_s"] for a in ag]
        if spread(tps) > cfg.noise:
            noisy.append(f"c={level} {meth} ({spread(tps):.0%})")
        med = float(np.median(tps))
        tt = [r["ttft_s"] for r in rs]
        tp = [1e3 * r["tpot_s"] for r in rs if r["tpot_s"] is not None]
        pool = ag[0].get("pool_bytes")
        se = all(a.get("steps") is not None for a in ag)  # the engine's runs (OpenVINO's report no calls)
        calls = [f"{np.median(v):.0f}" if se else "" for v in ([a.get("steps") for a in ag],
                                                              [sum((a.get("draft_batch") or {}).values()) for a in ag])]
        lines.append(f"| {level} | {meth} | {med:.1f} | {med / solo:.2f}x | {pct(tt, 50):.2f} | {pct(tt, 99):.2f} | "
                     f"{pct(tp, 50):.1f} | {pct(tp, 99):.1f} | {sum(r['identical'] for r in rs)}/{len(rs)} | "
                     f"{calls[0]} | {calls[1]} | {'' if pool is None else f'{pool / 2**20:.0f}'} | "
                     f"{ag[-1]['rss_mb']:.0f} |")
    bad = [r for r in records if not r["identical"] and r["method"].startswith("se-")]
    if bad:
        lines += ["", "**Not token-identical to the solo run**: " + ", ".join(
            f"{r['method']} c={r['concurrency']} request {r['request']} (q{r['question_id']})" for r in bad[:20]) +
            (f" and {len(bad) - 20} more" if len(bad) > 20 else "")]
    if noisy:
        lines += ["", f"**Noisy**: throughput spread more than {cfg.noise:.0%} over the repeats: " + ", ".join(noisy)]
    return "\n".join(lines)


def plot_load(records: list[dict], aggs: list[dict], info: dict, out: Path) -> None:
    """throughput.png: aggregate tokens/s against concurrency; latency.png: TPOT p50 against throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meths = list(dict.fromkeys(a["method"] for a in aggs))
    levels = sorted({a["concurrency"] for a in aggs})

    def med(meth, level):
        return float(np.median([a["tokens_per_s"] for a in aggs if a["method"] == meth and a["concurrency"] == level]))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in meths:
        ax.plot(levels, [med(m, c) for c in levels], marker="o", label=m)
    ax.axhline(info["solo_tokens_per_s"], color="k", lw=0.6, ls="--", label="one request, plain (solo)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_title(machine.label(), fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for m in meths:
        xs, ys = [], []
        for c in levels:
            tp = [1e3 * r["tpot_s"] for r in records if r["method"] == m and r["concurrency"] == c and r["tpot_s"]]
            xs.append(med(m, c))
            ys.append(pct(tp, 50))
        ax.plot(xs, ys, marker="o", label=m)
        for c, x, y in zip(levels, xs, ys):
            ax.annotate(str(c), (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("aggregate tokens/s")
    ax.set_ylabel("time per output token, p50 (ms)")
    ax.set_title("latency against throughput (labels: concurrency)", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
