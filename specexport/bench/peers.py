"""Every method of the per-question mode: prompt ids -> (new token ids without EOS, seconds, stats dict).

specexport's own methods run through `specexport.load`; each peer is imported only when a method needs it,
and `missing()` says in one line, before any work, why a peer cannot run here and how to install it.
OpenVINO GenAI's properties and the precision it ran at are kept in `Methods.info` for the records.
"""
from __future__ import annotations

import copy
import importlib.util
import time
from pathlib import Path

from .config import OV, BenchConfig, extra_bundle, parse_se

INSTALL = {
    "hf": "pip install 'specexport[build]' (torch + transformers)",
    "ortgenai": "pip install 'specexport[bench]' (onnxruntime-genai)",
    "llamacpp": "CMAKE_ARGS=-DGGML_NATIVE=ON pip install llama-cpp-python (bash scripts/bench.sh does it)",
    "ov": "pip install 'specexport[bench-openvino]' (openvino-genai)",
}
MODULES = {"hf": ("torch", "transformers"), "ortgenai": ("onnxruntime_genai",), "llamacpp": ("llama_cpp",),
           "ov": ("openvino_genai",)}
OV_PLD = dict(num_assistant_tokens=5, max_ngram_size=3)  # OpenVINO GenAI's prompt-lookup sample settings
F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def family(method: str) -> str:
    for f in ("se", "hf", "ortgenai", "llamacpp", "ov"):
        if method == f or method.startswith(f + "-"):
            return f
    raise ValueError(f"unknown method {method!r}")


def ov_spec(method: str, cfg: BenchConfig) -> dict:
    """ov[-cb][-int4][-default][-pld] -> the IR, the CPU properties and whether prompt lookup is on. Without
    -default the comparison is at float32 (compute and KV cache); -default takes the device's own hints."""
    cb, int4, default, pld = OV.match(method).groups()
    props = {"INFERENCE_NUM_THREADS": cfg.threads, **({} if default else F32)}
    return {"model": cfg.ov_int4_model if int4 else cfg.ov_model, "props": props, "pld": bool(pld),
            "batching": bool(cb)}


def ov_device_defaults() -> dict:
    """The CPU plugin's own precision hints: what -default methods run at (f32 on AVX2, bf16 with AMX)."""
    import openvino as ov

    core = ov.Core()
    vals = {p: core.get_property("CPU", p) for p in
            ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")}
    return {p: v.get_type_name() if hasattr(v, "get_type_name") else str(v) for p, v in vals.items()}  # 'f32'...


def missing(method: str, cfg: BenchConfig) -> str | None:
    """Why `method` cannot run here (one line with the fix), or None."""
    fam = family(method)
    for mod in MODULES.get(fam, ()):
        if importlib.util.find_spec(mod) is None:
            return f"the Python module {mod} is not installed: {INSTALL[fam]}"
    need = {"ortgenai": (cfg.ortgenai_model, "genai_config.json", "--ortgenai-model"),
            "llamacpp": (cfg.gguf, None, "--gguf")}.get(fam)
    if fam == "ov":
        need = (ov_spec(method, cfg)["model"], "openvino_model.xml",
                "--ov-int4-model" if "-int4" in method else "--ov-model")
    if need:
        path, inside, opt = need
        p = Path(path) / inside if inside else Path(path)
        if not p.exists():
            return f"no model at {p}: bash scripts/bench.sh makes it, or pass {opt}"
    return None


class Methods:
    """Loads each method's model once (on first use) and runs it on one prompt."""

    def __init__(self, cfg: BenchConfig):
        import specexport

        self.cfg = cfg
        self.pipe = specexport.load(cfg.bundle, threads=cfg.threads)
        self.pipes = {"": self.pipe}
        for spec in cfg.extra_bundles:
            tag, path, backend = extra_bundle(spec)
            self.pipes[tag] = specexport.load(path, threads=cfg.threads, backend=backend)
        self.eos = self.pipe.eos
        self._hf = self._assist = self._og = None
        self._llama: dict = {}
        self._ov: dict = {}
        self.info: dict = {}  # method -> what it ran with (OpenVINO's properties and precision)
        self.tables: dict = {}  # se-recycle-*: each method its own successor table, kept across questions

    def reset(self):
        """Forget what the recycle drafters learned (after the warm-up, which saw the first question)."""
        self.tables.clear()

    def snapshot(self, method: str):
        """The state a repeat of `method` must start from: a copy of its successor table (None: none yet)."""
        return copy.deepcopy(self.tables[method]) if method in self.tables else None

    def restore(self, method: str, state) -> None:
        if state is None:
            self.tables.pop(method, None)  # the next run starts with a fresh table, as the first did
        else:
            self.tables[method] = state

    def strip(self, ids):
        ids = list(ids)
        return ids[:next((i for i, t in enumerate(ids) if t in self.eos), len(ids))]

    def run(self, method: str, ids: list[int]):
        n = self.cfg.max_new_tokens
        fam = family(method)
        if fam == "se":
            return self._run_se(method, ids, n)
        return {"hf": self._run_hf, "ortgenai": self._run_og, "llamacpp": self._run_llama,
                "ov": self._run_ov}[fam](method, ids, n)

    def _run_se(self, method, ids, n):
        draft, k, tag = parse_se(method)
        pipe = self.pipes[tag]
        if draft == "recycle":  # never the table of another method that just generated this answer
            if method not in self.tables:  # the bundle's seeded table (a copy), else an empty one
                self.tables[method] = pipe.fresh_table()
            pipe.successors = self.tables[method]
        t = time.perf_counter()
        g = pipe.generate(ids, max_new_tokens=n, draft=draft, k=k, temperature=self.cfg.temperature,
                          top_p=self.cfg.top_p, seed=self.cfg.seed)
        dt = time.perf_counter() - t
        return self.strip(g.token_ids), dt, g.stats.to_dict()

    def _run_ov(self, method, ids, n):
        import numpy as np
        import openvino as ov
        import openvino_genai as og

        from ..backends.ov import same_sigaltstack

        if method not in self._ov:
            spec = ov_spec(method, self.cfg)
            # LLMPipeline caches prompt prefixes across calls by default: a prompt seen before prefills in
            # ~0.05 s, which would make --repeats and the --ttft mode time a cache hit. Spec-Bench's chat
            # prompts share 24 tokens, less than one 32-token block, so a first run is the same either way.
            sc = og.SchedulerConfig()
            sc.enable_prefix_caching = False
            with same_sigaltstack():  # OpenVINO's compile leaves a signal stack it may unmap (backends/ov.py)
                self._ov[method] = og.LLMPipeline(spec["model"], "CPU", **spec["props"], scheduler_config=sc,
                                                  **({"prompt_lookup": True} if spec["pld"] else {}))
            self.info[method] = {"model": str(spec["model"]), "properties": spec["props"], "prefix_caching": False,
                                 "prompt_lookup": OV_PLD if spec["pld"] else None,
                                 "device_defaults": ov_device_defaults()}
        pipe = self._ov[method]
        gc = pipe.get_generation_config()
        gc.max_new_tokens = n
        gc.stop_token_ids = set(self.eos)  # stop where our pipeline stops (the bundle's EOS ids)
        if self.info[method]["prompt_lookup"]:
            gc.num_assistant_tokens, gc.max_ngram_size = OV_PLD["num_assistant_tokens"], OV_PLD["max_ngram_size"]
        if self.cfg.temperature:
            gc.do_sample, gc.temperature, gc.top_p = True, self.cfg.temperature, self.cfg.top_p
            gc.rng_seed = self.cfg.seed
        else:
            gc.do_sample = False
        x = np.array([ids], dtype=np.int64)
        inputs = og.TokenizedInputs(ov.Tensor(x), ov.Tensor(np.ones_like(x)))  # our chat rendering, its model
        t = time.perf_counter()
        r = pipe.generate(inputs, gc)
        dt = time.perf_counter() - t
        return self.strip(r.tokens[0]), dt, {}

    def _run_llama(self, method, ids, n):
        if method not in self._llama:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

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

    def _run_og(self, method, ids, n):
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
