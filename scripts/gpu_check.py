"""GPU checks and timings in one go, for the lent GPU machine (issue 5). Two halves:

  python scripts/gpu_check.py prepare --pack gpu_pack     # here, on a CPU machine with the build extras
  python scripts/gpu_check.py run --pack gpu_pack         # on the GPU machine: torch (CUDA), numpy, onnxruntime

`prepare` writes a small pack (a few MB: the GPU machine cannot download and carries at most 64 MiB): a tiny
random target + noisy draft checkpoint (transformers' save_pretrained), their bundle, the state dicts as .pt
(safetensors may be absent there), prompts as token ids (no tokenizer needed there) and the reference tokens:
transformers' eager greedy generate, computed here.

`run` checks, for every backend it can run there, that greedy output equals that reference with every draft
(none, model, ngram, recycle), that the batching engine on the torch backend gives each request its solo
tokens (every prompt at once: B > 1 calls, CUDA-graph captured per (B, T) on CUDA; the draft model batched
across rows on the device too, at k = 4 and k = "auto"), and times one step of a SmolLM2-shaped and a
Llama-7B-shaped model with random weights (speed does not depend on the values) eagerly and replayed from CUDA
graphs, float32 and bfloat16.
It prints a markdown report and writes it to $OUT/gpu_check.md (or --out). Without CUDA it runs the CPU rows
only (a dry run of the script itself).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DRAFTS = [("none", 4), ("model", 2), ("model", 4), ("ngram", 4), ("recycle", 8)]
PROMPTS = ["hello world, hello world", "the cat sat on the mat. the cat", "abc abc abc", "Q: 12+7? A:"]
NEW = 40


def prepare(pack: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from checkpoints import make_checkpoint, perturbed_copy
    from specexport.exporter.build import BuildConfig, DraftSpec, build

    import specexport

    pack.mkdir(parents=True, exist_ok=True)
    target = make_checkpoint(pack / "ckpt-target", layers=3, seed=0, logit_scale=4.0)
    draft = perturbed_copy(target, pack / "ckpt-draft", noise=0.3)
    build(BuildConfig(target=str(target), out=pack / "bundle", draft=DraftSpec.parse(str(draft)), ks=(1, 2, 4, 8),
                      capacity=256, prefill_chunk=16, force=True, attention="portable"),  # device backends bind it
          log=lambda s: None)
    pipe = specexport.load(pack / "bundle")
    hf = AutoModelForCausalLM.from_pretrained(target, attn_implementation="eager").eval()
    cases = []
    for p in PROMPTS:
        ids = pipe.encode(p)
        with torch.no_grad():
            x = torch.tensor([ids])
            want = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW, do_sample=False,
                               pad_token_id=0)[0, len(ids):].tolist()
        cases.append({"prompt": p, "ids": ids, "transformers": want})
    (pack / "reference.json").write_text(json.dumps(cases))
    from safetensors.torch import load_file

    for name, ck in (("target", target), ("draft", draft)):
        torch.save(load_file(str(next(Path(ck).glob("*.safetensors")))), pack / f"{name}.pt")
    size = sum(f.stat().st_size for f in pack.rglob("*") if f.is_file())
    print(f"wrote {pack} ({size / 2**20:.1f} MiB)")


def failed(e: BaseException, n: int = 200) -> str:
    """A report cell for a part that raised: one failure must not hide the other rows."""
    return f"FAILED: {type(e).__name__}: {str(e)[:n]}"


def run_case(target, draft_backend, ids, draft, k):
    from specexport.runtime.decoder import DecodeConfig, Stats, generate
    from specexport.runtime.drafters import ModelDrafter, NgramDrafter, RecycleDrafter, SuccessorTable

    drafter = {"none": lambda: None, "model": lambda: ModelDrafter(draft_backend),
               "ngram": lambda: NgramDrafter(3),
               "recycle": lambda: RecycleDrafter(SuccessorTable(target.entry.arch["vocab_size"]))}[draft]()
    st = Stats()
    out = []
    for new in generate(target, drafter, ids, DecodeConfig(max_new_tokens=NEW, k=k, draft=draft), st):
        out += new
    return out[:NEW], st


def check_backends(pack: Path, cuda: bool) -> list[str]:
    import torch

    from specexport import bundle
    from specexport.backends.ort import OrtBackend
    from specexport.backends.torch_graphs import TorchBackend

    m = bundle.read(pack / "bundle")
    cases = json.loads((pack / "reference.json").read_text())
    sds = {r: torch.load(pack / f"{r}.pt") for r in ("target", "draft")}

    def torch_pair(device, graphs, dtype=torch.float32):
        return [TorchBackend(pack / "bundle", e, m.buckets, device=device, cuda_graphs=graphs, dtype=dtype,
                             state_dict=sds[e.role]) for e in (m.target, m.draft)]

    backends = {"onnxruntime CPU": lambda: [OrtBackend(pack / "bundle", e, m.buckets) for e in (m.target, m.draft)],
                "torch CPU eager": lambda: torch_pair("cpu", False)}
    if cuda:
        import onnxruntime as ort

        if "CUDAExecutionProvider" in ort.get_available_providers():
            from specexport.backends.ort_device import OrtDeviceBackend

            backends["onnxruntime CUDA EP, IO binding"] = lambda: [
                OrtDeviceBackend(pack / "bundle", e, m.buckets, device="cuda") for e in (m.target, m.draft)]
        try:
            import tensorrt  # noqa: F401

            from specexport.exporter.tensorrt import build_engine
            from specexport.backends.trt import TrtBackend

            def trt_pair():
                es = [dataclasses.replace(e, engine=build_engine(pack / "bundle", e, m.buckets, "fp32"))
                      for e in (m.target, m.draft)]
                return [TrtBackend(pack / "bundle", e, m.buckets) for e in es]
            backends["TensorRT fp32 + CUDA graphs"] = trt_pair
        except ImportError:
            pass
        backends["torch CUDA eager fp32"] = lambda: torch_pair("cuda", False)
        backends["torch CUDA graphs fp32"] = lambda: torch_pair("cuda", True)
        backends["torch CUDA graphs bf16"] = lambda: torch_pair("cuda", True, torch.bfloat16)
    notes = []
    rows = ["| backend | draft | k | tokens/s | tau | identical to transformers | identical to its own plain |",
            "|---|---|---|---|---|---|---|"]
    for name, make in backends.items():
        try:
            t, d = make()
        except Exception as e:  # noqa: BLE001 - one backend failing must not hide the others' rows
            rows.append(f"| {name} | - | - | - | - | {failed(e)} | |")
            print(rows[-1], flush=True)
            continue
        te = t.entry
        notes.append(f"- {name}: verify vs decode max|dlogit| "
                     f"{'not measured at load' if te.verify_drift is None else f'{te.verify_drift:.2g}'}; "
                     f"{'speculation allowed' if te.speculative else 'loads plain-only (Pipeline refuses drafts)'}")
        plain = {}  # the backend's own greedy (draft none): what speculation must equal at any precision
        for draft, k in DRAFTS:
            try:
                run_case(t, d, cases[0]["ids"], draft, k)  # warm-up: CUDA-graph captures, allocations
                same, own, n, secs, steps = True, True, 0, 0.0, 0
                for i, c in enumerate(cases):
                    t0 = time.perf_counter()
                    out, st = run_case(t, d, c["ids"], draft, k)
                    secs += time.perf_counter() - t0
                    n, steps = n + len(out), steps + st.steps
                    same &= out == c["transformers"]
                    own &= out == plain.setdefault(i, out)
                rows.append(f"| {name} | {draft} | {k} | {n / secs:.0f} | {n / steps:.2f} | "
                            f"{'yes' if same else 'NO'} | {'yes' if own else 'NO'} |")
            except Exception as e:  # noqa: BLE001
                rows.append(f"| {name} | {draft} | {k} | - | - | {failed(e)} | |")
            print(rows[-1], flush=True)
    return rows + ["", "The rows call the decoder directly, so they run drafts even where a Pipeline would refuse them:",
                   ""] + notes


def check_batched(pack: Path, cuda: bool) -> list[str]:
    """The batching engine on the torch backend (pool rows in a device tensor; on CUDA each (B, T) step captured
    in a CUDA graph): every prompt submitted at once, each request's tokens against its solo run on the same
    backend, and the batch's tokens/s."""
    import torch

    import specexport
    from specexport import bundle
    from specexport.backends.torch_graphs import TorchBackend

    m = bundle.read(pack / "bundle")
    cases = json.loads((pack / "reference.json").read_text())
    sds = {r: torch.load(pack / f"{r}.pt") for r in ("target", "draft")}
    variants = {"torch CPU eager": ("cpu", False)}
    if cuda:
        variants |= {"torch CUDA eager fp32": ("cuda", False), "torch CUDA graphs fp32": ("cuda", True)}
    rows = ["| backend | draft | k | requests | max batch | tokens/s | draft calls | identical to solo |",
            "|---|---|---|---|---|---|---|---|"]
    for name, (device, graphs) in variants.items():
        try:
            pipe = specexport.load(pack / "bundle", verify=False)  # tokenizer and config; both models replaced
            pipe.target, pipe.draft = [  # by the torch backend on the device (the checkpoints are not here)
                TorchBackend(pack / "bundle", e, m.buckets, device=device, cuda_graphs=graphs,
                             state_dict=sds[e.role], batch_sizes=m.batch_sizes) for e in (m.target, m.draft)]
            solo = [pipe.generate(c["ids"], max_new_tokens=NEW, draft="none").token_ids for c in cases]
            B = min(len(cases), m.batch_sizes[-1])
            # model: the draft batched across rows in its own device pool; k="auto": the choice of k per step
            # from the (B, T) call costs measured on this device (the GPU's prices, not the CPU's)
            for draft, k in (("none", 4), ("ngram", 4), ("recycle", 4), ("model", 4), ("model", "auto")):
                pipe.start_engine(max_batch=B)  # warms every (B, T) shape: CUDA-graph captures happen here
                t0 = time.perf_counter()
                outs = [c.wait(600).token_ids for c in
                        [pipe.submit(c["ids"], max_new_tokens=NEW, draft=draft, k=k) for c in cases]]
                secs = time.perf_counter() - t0
                same = sum(o == w for o, w in zip(outs, solo))
                calls = sum(pipe.engine.stats()["draft_batch"].values())
                rows.append(f"| {name} | {draft} | {k if draft != 'none' else '-'} | {len(cases)} | {B} | "
                            f"{sum(map(len, outs)) / secs:.0f} | {calls} | {same}/{len(cases)} |")
                print(rows[-1], flush=True)
        except Exception as e:  # noqa: BLE001 - one backend failing must not hide the others' rows
            rows.append(f"| {name} | - | - | - | - | - | - | {failed(e)} |")
            print(rows[-1], flush=True)
    return rows


SHAPES = {  # GraphConfig numbers of the real models; weights random
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, tie_word_embeddings=True),
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32, num_heads=32,
                     num_kv_heads=32, head_dim=128, tie_word_embeddings=False),
}


def time_steps(pack: Path, device: str, shapes: list[str], dtypes: list, ts=(1, 5, 9), S: int = 512,
               reps: int = 30, bs=(1, 4, 8, 16)) -> tuple[list[str], list[str]]:
    """-> (one-sequence step rows, batched step rows): the median time of a step of T tokens at cache length S/2,
    and of a call of B rows x T tokens on a pool whose rows all sit at S/2 (what a batch costs against one row)."""
    import numpy as np
    import torch

    from specexport import bundle
    from specexport.graphs.config import GraphConfig
    from specexport.graphs.llama import LlamaGraph, rotation
    from specexport.backends.torch_graphs import TorchBackend

    m = bundle.read(pack / "bundle")
    rows = ["| model (random weights) | dtype | T | S | eager ms | CUDA graph ms | graph speedup |",
            "|---|---|---|---|---|---|---|"]
    brows = ["| model (random weights) | dtype | B | T | eager ms | CUDA graph ms | graph ms / (1, 1) graph ms |",
             "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        for dtype in dtypes:
            d = SHAPES[shape]
            D = d["head_dim"]
            inv = tuple(1.0 / 10000 ** (i / D) for i in range(0, D, 2))
            c = GraphConfig(arch="llama", rms_norm_eps=1e-5, rope_type="default", inv_freq=inv, rope_scaling=1.0,
                            qkv_bias=False, o_bias=False, mlp_bias=False, **d)
            with torch.device("meta"):
                g = LlamaGraph(c)
            g = g.to_empty(device=device).to(dtype)
            with torch.no_grad():
                for p in g.parameters():
                    p.normal_(0, 0.02)
            g.inv_freq = torch.tensor(inv, dtype=torch.float32, device=device)
            g.rot = rotation(D).to(device, dtype)
            g.eye = torch.eye(D, device=device, dtype=dtype)
            entry = dataclasses.replace(m.target, arch=c.summary(), profiles={f"t{T}": T for T in ts})
            res, bres = {}, {}
            for graphs in (False, True) if device == "cuda" else (False,):
                be = TorchBackend(pack / "bundle", entry, [S], device=device, cuda_graphs=graphs, dtype=dtype, graph=g,
                                  batch_sizes=list(bs))
                cache = be.new_cache()
                cache.n = S // 2
                for T in ts:
                    for _ in range(3):
                        be.step(cache, [1] * T, cache.n)
                    times = []
                    for _ in range(reps):
                        times.append(be.step(cache, [1] * T, cache.n).run_s)
                    res[graphs, T] = statistics.median(times) * 1e3
                del cache
                try:  # a failure here must not lose the one-sequence rows
                    pool = be.new_pool(max(bs))
                    pool.n[:] = S // 2
                    for B in bs:
                        for T in (1, 5):
                            ids = np.ones((B, T), dtype=np.int64)
                            pos = (S // 2 + np.arange(T))[None].repeat(B, 0)
                            times = [be.step_batch(pool, ids, pos).run_s for _ in range(reps + 3)][3:]
                            bres[graphs, B, T] = statistics.median(times) * 1e3
                    del pool
                except Exception as e:  # noqa: BLE001
                    brows.append(f"| {shape} | {str(dtype).split('.')[-1]} | - | - | FAILED (graphs={graphs}): "
                                 f"{type(e).__name__}: {str(e)[:200]} | | |")
                    print(brows[-1], flush=True)
                del be
            for T in ts:
                e, r = res[False, T], res.get((True, T))
                rows.append(f"| {shape} | {str(dtype).split('.')[-1]} | {T} | {S} | {e:.2f} | "
                            + (f"{r:.2f} | {e / r:.1f}x |" if r else "- | - |"))
                print(rows[-1], flush=True)
            for B in bs:
                for T in (1, 5):
                    if (False, B, T) not in bres:
                        continue
                    e, r = bres[False, B, T], bres.get((True, B, T))
                    base = bres.get((True, 1, 1), bres[False, 1, 1])
                    brows.append(f"| {shape} | {str(dtype).split('.')[-1]} | {B} | {T} | {e:.2f} | "
                                 + (f"{r:.2f} | {r / base:.2f} |" if r else f"- | {e / base:.2f} |"))
                    print(brows[-1], flush=True)
            del g
            torch.cuda.empty_cache() if device == "cuda" else None
    return rows, brows


def run(pack: Path, out: Path, timing: bool = True) -> None:
    import torch

    cuda = torch.cuda.is_available()
    head = [f"# gpu_check {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
            f"device: {torch.cuda.get_device_name(0) if cuda else 'no CUDA device (dry run: CPU rows only)'}; "
            f"torch {torch.__version__}", ""]
    for mod in ("tensorrt", "onnxruntime", "cupy", "transformers"):
        try:
            v = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - report whatever is missing
            v = f"absent ({type(e).__name__})"
        head.append(f"- {mod}: {v}")
    try:
        import onnxruntime as ort
        head.append(f"- onnxruntime providers: {ort.get_available_providers()}")
    except Exception:  # noqa: BLE001
        pass
    print("\n".join(head), flush=True)
    rows = check_backends(pack, cuda)
    batched = check_batched(pack, cuda)
    if not timing:
        timing, btiming = ["(--no-timing)"], []
    elif cuda:
        try:
            timing, btiming = time_steps(pack, "cuda", ["smollm2-135m", "llama-7b"], [torch.float32, torch.bfloat16])
        except Exception as e:  # noqa: BLE001 - keep the correctness rows above
            timing, btiming = [failed(e, 300)], []
    elif os.environ.get("GPU_CHECK_CPU_TIMING"):  # a dry run of the timing code itself, small
        timing, btiming = time_steps(pack, "cpu", ["smollm2-135m"], [torch.float32], reps=2, bs=(1, 2))
    else:
        timing, btiming = ["(step timings need CUDA: skipped)"], []
    text = "\n".join(head + ["", "## Greedy output vs transformers (tiny random checkpoints)", ""] + rows +
                     ["", "## Many requests at once: the batching engine, each request vs its solo run", ""] + batched +
                     ["", "## One step, median of 30 (includes input upload and logits download)", ""] + timing +
                     ["", "## One batched call, B rows x T tokens at cache length 256 (median of 30)", ""] + btiming)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.md").write_text(text + "\n")
    print(f"\nwrote {out / 'gpu_check.md'}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["prepare", "run"])
    p.add_argument("--pack", type=Path, default=ROOT / "gpu_pack")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")))
    p.add_argument("--no-timing", action="store_true", help="run: the correctness rows only (no step timings)")
    a = p.parse_args()
    prepare(a.pack) if a.what == "prepare" else run(a.pack, a.out, timing=not a.no_timing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
