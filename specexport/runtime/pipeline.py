"""Pipeline: a loaded bundle -> text in, text out. Tokenizer, chat template, stop rules, streaming.

One Pipeline loads each model once and serves any number of generations, in a row or from several
threads: every generation has its own caches, sampler state and stats. Imports neither torch nor
transformers (tokenizers, jinja2, numpy, onnxruntime only).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .. import bundle
from ..errors import OptionError, PromptTooLong
from ..backends import open_model
from .accept import Picker
from .decoder import DecodeConfig, Stats, generate
from .drafters import ModelDrafter, NgramDrafter, RecycleDrafter, RowDraft, SuccessorTable, shares_cache, shares_pool
from .engine import Completion, Engine, Sequence
from .text import TextStream
from .sampling import SamplingParams
from . import prefix, validate


@dataclass
class Generation:
    text: str = ""
    token_ids: list = field(default_factory=list)  # new tokens only (an EOS that ended it included)
    prompt_ids: list = field(default_factory=list)
    finish_reason: str = ""  # "eos" | "stop" | "length"
    stats: Stats = field(default_factory=Stats)


class Pipeline:
    def __init__(self, path: str | Path, threads: int | None = None, verify: bool = True,
                 backend: str = "onnxruntime", device: str = "cpu"):
        threads, verify, backend, device = validate.load_args(threads, verify, backend, device)
        self.root, self.backend = Path(path), backend
        self.manifest = bundle.read(self.root, verify=verify)
        m = self.manifest
        def make(e):
            return open_model(backend, self.root, e, m, threads=threads, device=device)

        self.target = validate.open_model(make, m.target)
        self.draft = validate.open_model(make, m.draft) if m.draft else None
        tk = m.tokenizer
        self.tokenizer = validate.tokenizer(self.root, m)
        self.eos = set(tk["eos_token_ids"])
        self.seed = validate.successors(self.root, m)  # the bundle's seeded successor table, or None
        self.successors = self.fresh_table()  # the recycle drafter's, kept across calls
        self._template = None  # the compiled chat template
        self._engine: Engine | None = None

    def fresh_table(self) -> SuccessorTable:
        """A successor table as this pipeline starts with: a copy of the bundle's seeded one, else empty."""
        if self.seed is None:
            return SuccessorTable(self.manifest.target.arch["vocab_size"])
        return self.seed.copy()

    # ---- text <-> ids
    def encode(self, prompt, chat: bool = False) -> list[int]:
        """A string (plain, or a user turn when chat), a list of chat messages, or token ids."""
        chat = validate.flag(chat, "chat")
        kind, prompt = validate.prompt(prompt, self.manifest.target.arch["vocab_size"])
        if kind == "ids":
            return prompt
        if kind == "messages" or chat:
            messages = prompt if kind == "messages" else [{"role": "user", "content": prompt}]
            return self.tokenizer.encode(self.render_chat(messages), add_special_tokens=False).ids
        return self.tokenizer.encode(prompt).ids

    def render_chat(self, messages: list[dict]) -> str:
        """The prompt text for chat messages, as transformers' apply_chat_template renders it (runtime/chat.py)."""
        from .chat import MAX_CHARS, ChatTemplate

        tk = self.manifest.tokenizer
        if not tk.get("chat_template"):
            raise OptionError("this bundle's tokenizer has no chat template: pass a plain prompt (no --chat)")
        if self._template is None:  # compiling it takes ~10-40 ms: once per pipeline, not per request
            # a prompt that fits the cache has at most `capacity` tokens, far under 64 characters each
            self._template = ChatTemplate(tk["chat_template"], tk.get("special_tokens") or {},
                                          max_chars=max(MAX_CHARS, 64 * self.manifest.capacity))
        return self._template.render(messages)

    # ---- generation
    def config(self, max_new_tokens=128, k=None, draft=None, temperature=0.0, top_k=0, top_p=1.0, seed=0,
               sampler="gumbel", ngram=3) -> DecodeConfig:
        """Validate options against this bundle (before any work)."""
        max_new_tokens, k, draft, temperature, top_k, top_p, seed, sampler, ngram = validate.options(
            max_new_tokens, k, draft, temperature, top_k, top_p, seed, sampler, ngram)
        ks = self.target.entry.verify_ks()
        speculative = self.target.entry.speculative
        if draft is None:
            separate = self.draft is not None and self.draft.entry.kind == "checkpoint"
            draft = "model" if speculative and (separate or self._self_draft_pays()) else self._free_draft()
        if draft != "none" and not speculative:
            drift = self.target.entry.verify_drift
            why = getattr(self.target, "numerics", None) or f"{self.target.entry.activations} activations"
            fix = getattr(self.target, "plain_only_fix", None) or "rebuild with --target-activations float32"
            raise ValueError(f"this target computes with {why}: a verify call scores tokens differently from "
                             f"plain decoding (max |dlogit| {float('nan') if drift is None else drift:.2g}), so "
                             f"speculation would not be lossless; use draft='none', or {fix}")
        if draft == "model" and self.draft is None:
            raise ValueError("this bundle has no draft model: use draft='ngram' or 'none', or rebuild with --draft")
        adaptive = k == "auto"
        if draft == "recycle" and k is None:
            k = "auto"  # the tree size is chosen per step anyway: allow every profile
        k = max(ks) if k == "auto" else k if k is not None else (4 if 4 in ks else ks[len(ks) // 2])
        if draft != "none" and k not in ks:
            raise ValueError(f"the bundle has verify profiles for k in {ks}, not k={k}: pick one of those or "
                             f"rebuild with --k including {k}")
        sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, sampler=sampler)
        return DecodeConfig(max_new_tokens=max_new_tokens, k=k, draft=draft, sampling=sp, ngram=ngram,
                            adaptive=adaptive)

    def _self_draft_pays(self) -> bool:
        """Whether the bundle's self-draft (an int4 or int8 copy of the target) is the default draft: where it reads
        the target's cache and runs specexport's MatMulNBits kernel (`nbits`), an int4 drafted token costs ~0.22 of
        a float32 SmolLM2 step and it led recycle solo (1.52-1.62x plain against 1.17-1.24x) and on the batching
        engine at 1, 2 and 4 requests (1.67x / 1.47x / 1.08x plain against 1.44x / 1.35x / 1.02x; level at 8),
        docs/benchmarks.md "The self-draft on the target's pool". On onnxruntime's kernels it cost ~half a target
        step per drafted token and stayed below recycle; an early-exit slice has a cache of its own. An int8 copy
        costs 1.45-1.6x an int4 one per call on AVX2, 1.3x on AVX512-VNNI, and is accepted far more often
        (docs/benchmarks.md "An int8 self-draft" and "The int8 self-draft on `epyc-zen4`")."""
        d = self.draft
        return (d is not None and self.target.entry.speculative and d.entry.kind in ("int4", "int8")
                and bool(getattr(d, "nbits", False)) and shares_cache(self.target, d))

    def _free_draft(self) -> str:
        """The default model-free draft: recycle, or none on a target that cannot speculate."""
        return "recycle" if self.target.entry.speculative else "none"

    def _recycler(self, cfg: DecodeConfig):
        """A factory of the recycle drafter: a tree, or its best path where only a chain's verify rows score
        exactly as decode rows (the target's `exact_trees`: int8 activations, OpenVINO in bfloat16)."""
        chain = not getattr(self.target, "exact_trees", True)
        return lambda: RecycleDrafter(self.successors, cfg.ngram, chain=chain)

    def _check_fits(self, ids: list[int], cfg: DecodeConfig) -> None:
        S = self.manifest.capacity
        if not ids:
            raise OptionError("the prompt is empty")
        if len(ids) + cfg.max_new_tokens > S:
            raise PromptTooLong(f"prompt ({len(ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                                f"bundle's capacity of {S} tokens: lower max_new_tokens or rebuild with "
                                f"--capacity {len(ids) + cfg.max_new_tokens} or more")

    def stream(self, prompt, chat: bool = False, stop: tuple = (), result: Generation | None = None,
               **opts) -> Iterator[str]:
        """Yield text pieces as soon as they are accepted; `result` (if given) is filled as it goes."""
        validate.option_names(opts, self.config)
        stop = validate.stop(stop)
        cfg = self.config(**opts)
        ids = self.encode(prompt, chat)
        g = result if result is not None else Generation()
        g.prompt_ids, g.token_ids, g.text = ids, [], ""
        self._check_fits(ids, cfg)
        drafter = {"model": lambda: ModelDrafter(self.draft, shares_cache(self.target, self.draft)),
                   "ngram": lambda: NgramDrafter(cfg.ngram),
                   "recycle": self._recycler(cfg), "none": lambda: None}[cfg.draft]()
        ts = TextStream(self.tokenizer, self.eos, tuple(stop), cfg.max_new_tokens, g)
        steps = generate(self.target, drafter, ids, cfg, g.stats)
        for new in steps:
            piece, done = ts.push(new)
            if piece:
                yield piece
            if done:
                steps.close()
                break

    # ---- many requests at once
    def start_engine(self, max_batch: int | None = None, max_queue: int = 64,
                     prefill_budget: int | None = None, warm: bool = True,
                     prefix_cache_mb: float = prefix.DEFAULT_MB) -> Engine:
        """(Re)configure the batching engine that `submit` uses: at most `max_batch` requests decode together
        in one target call per step (default: the bundle's largest batch size), at most `max_queue` more
        wait (past that `submit` raises QueueFull); `prefill_budget`: prompt tokens prefilled per step
        while others decode (default: one prefill chunk per request still prefilling, at most four; no limit
        while nothing decodes); `warm`: run each
        call shape once now (Engine.warm: a few seconds for SmolLM2 on 2 cores) so that the first requests
        do not pay the backend's first-call costs. `prefix_cache_mb`: memory for the K/V of prompts (and ended
        requests) that later requests start with (runtime/prefix.py; 0 turns it off); with a chat template its
        preamble, the tokens every chat prompt starts with, is prefilled into it now."""
        if not hasattr(self.target, "step_batch"):
            raise OptionError(f"backend {self.backend!r} runs one sequence per call: the batching engine (submit, "
                              "generate_batch, the server) needs backend onnxruntime, openvino or torch; "
                              "generate and stream work on this one")
        if self._engine is not None:
            self._engine.close()
        if getattr(self.target, "fixed", None):  # OpenVINO's fixed-shape models: one sequence only
            self.target.drop_fixed()
        mb = validate.prefix_cache_mb(prefix_cache_mb)
        draft = self.draft if hasattr(self.draft, "step_batch") else None
        self._engine = Engine(self.target, self._sequence, max_batch=max_batch or self.target.batch_sizes[-1],
                              max_queue=max_queue, prefill_budget=prefill_budget, draft=draft,
                              prefix_cache=int(mb * 2 ** 20), successors=self.fresh_table() if draft else None)
        if warm:
            self._engine.warm()
        if self._engine.prefixes is not None and self.manifest.tokenizer.get("chat_template"):
            self._engine.cache_prefix(self.chat_preamble())
        return self._engine

    def chat_preamble(self) -> list[int]:
        """The tokens every chat prompt of this bundle starts with (the template's system turn and the user
        turn's header): what two one-message chats have in common."""
        a, b = (self.encode([{"role": "user", "content": t}]) for t in ("Hi.", "What is 2 + 2?"))
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return a[:n]

    @property
    def engine(self) -> Engine:
        return self._engine or self.start_engine()

    def submit(self, prompt, chat: bool = False, stop: tuple = (), **opts) -> Completion:
        """Queue one request on the batching engine -> Completion (iterate it for text pieces; .generation,
        .cancel(), .wait()). Options as `generate`, validated here before anything is queued. The engine runs
        the drafts (draft="recycle" by default; "model" with k="auto" by default for an int4 self-draft where it
        pays, `_self_draft_pays`; "ngram", "none"); with k="auto" (recycle's default) it sizes every step's
        speculation to the batch. draft="model" (a bundle with a draft model) drafts for
        all such requests in shared draft calls (drafters.PoolDrafts)."""
        validate.option_names(opts, self.config)
        stop = validate.stop(stop)
        if opts.get("draft") == "model" and self.draft is not None and not hasattr(self.draft, "step_batch"):
            raise OptionError(f"the draft model on backend {self.backend!r} runs one sequence per call: in the "
                              "batching engine use draft='recycle', 'ngram' or 'none'; draft='model' runs through "
                              "Pipeline.generate / stream")
        if opts.get("draft") is None:  # an int4 self-draft on the target's pool where it pays (k sized per step)
            model = self._self_draft_pays() and shares_pool(self.target, self.draft)
            opts = {**opts, "draft": "model" if model else self._free_draft(),
                    **({"k": "auto"} if model and opts.get("k") is None else {})}
        cfg = self.config(**opts)
        ids = self.encode(prompt, chat)
        self._check_fits(ids, cfg)
        c = Completion(Generation(prompt_ids=ids))
        c.request = (ids, tuple(stop), cfg)
        return self.engine.submit(c)

    def _sequence(self, c: Completion) -> Sequence:
        """The engine's state for one admitted request (called on the engine's thread)."""
        ids, stop, cfg = c.request
        g = c.generation
        g.stats.prompt_tokens = len(ids)
        drafter = {"ngram": lambda: NgramDrafter(cfg.ngram), "recycle": self._recycler(cfg), "model": RowDraft,
                   "none": lambda: None}[cfg.draft]()
        return Sequence(c, list(ids), cfg, TextStream(self.tokenizer, self.eos, stop, cfg.max_new_tokens, g),
                        drafter=drafter, pick=Picker(cfg.sampling))

    def close(self, timeout: float | None = None) -> bool:
        """Stop the engine: no new requests, running ones finish (up to `timeout` s)."""
        return self._engine.close(timeout) if self._engine is not None else True

    def generate(self, prompt, chat: bool = False, stop: tuple = (), **opts) -> Generation:
        """Generate to the end -> Generation (.text, .token_ids, .finish_reason "eos" | "stop" | "length", .stats).

        prompt: a string (a user turn when chat=True), a list of chat messages ({"role", "content"}), or token
        ids. stop: stop strings (a string is one). Options, all keyword-only, validated before any work:
          max_new_tokens  int >= 1, default 128
          draft           "model" | "ngram" | "recycle" | "none" | None (default: the draft model when the
                          bundle's draft is a separate checkpoint, or an int4 self-draft on specexport's
                          int4 kernel, else recycle; none = plain decoding)
          k               one of the bundle's verify k, or "auto" (chosen per step); default 4, recycle: auto
          temperature     float >= 0, default 0 (greedy); top_k int >= 0 (0 = off); top_p in (0, 1] (1 = off)
          seed            int in [0, 2**63), default 0; sampler "gumbel" (default) | "rejection"
          ngram           longest n-gram prompt lookup matches, default 3
        An unknown option is an OptionError that lists these. `generate_batch` runs many prompts together."""
        g = Generation()
        for _ in self.stream(prompt, chat=chat, stop=stop, result=g, **opts):
            pass
        return g

    def generate_batch(self, prompts: list, chat: bool = False, stop: tuple = (), **opts) -> list[Generation]:
        """Generate every prompt of `prompts` together on the batching engine (options as `generate`; draft:
        recycle, ngram or none) -> one Generation per prompt, in order; each is what it would be alone."""
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise OptionError("generate_batch takes a non-empty list of prompts")
        cs = [self.submit(p, chat=chat, stop=stop, **opts) for p in prompts]
        out = []
        for c in cs:
            g = c.wait()
            if c.error is not None:
                raise c.error
            out.append(g)
        return out


def load(path: str | Path, threads: int | None = None, verify: bool = True, backend: str = "onnxruntime",
         device: str = "cpu") -> Pipeline:
    return Pipeline(path, threads=threads, verify=verify, backend=backend, device=device)
