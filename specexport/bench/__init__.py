"""`specexport bench`: Spec-Bench on this machine, every method interleaved per question.

Methods (comma-separated in --methods; the first is the reference):
  hf                transformers eager greedy generate of the target (the reference)
  hf-pld            transformers prompt lookup decoding (prompt_lookup_num_tokens=10)
  hf-assist-int8    transformers assisted generation, draft = dynamic-int8 copy of the target
  ortgenai          onnxruntime-genai fp32, built offline from the same checkpoint (--ortgenai-model)
  ov                OpenVINO GenAI LLMPipeline on the fp32 IR (--ov-model), float32 compute and KV cache
                    (INFERENCE_PRECISION_HINT=f32, KV_CACHE_PRECISION=f32)
  ov-pld            the same with its prompt lookup (num_assistant_tokens=5, max_ngram_size=3)
  ov-default        the fp32 IR at the CPU plugin's own precision hints (bf16 on AMX machines, u8 KV cache);
                    ov-int4[-default][-pld]: the int4 IR (--ov-int4-model) likewise
  llamacpp          llama.cpp (llama-cpp-python) plain greedy decoding of the original GGUF (--gguf)
  llamacpp-pld      llama.cpp with its prompt-lookup draft (LlamaPromptLookupDecoding, 10 tokens)
  se-none           specexport plain decoding through the bundle's decode profile
  se-ngram-kK       specexport with the prompt-lookup drafter, k = K
  se-model-kK       specexport with the bundle's draft model, k = K (kauto: adaptive k)
  se-recycle-kK     specexport token recycling + prompt lookup tree, at most K nodes (its own successor
                    table per method, carried from question to question as in the paper, never shared)
  se-...@TAG        any se- method on another bundle given as --extra-bundle TAG=PATH (e.g. an int4 target
                    with int8 activations beside the float32-activation one)
A peer that is not installed, or whose converted model is missing, is skipped with one line saying how to
get it (bash scripts/bench.sh installs and converts everything).

Greedy by default; --temperature T (with --top-p, --seed) makes every method sample. specexport's sampler
is Gumbel-max with per-position noise, so all specexport methods on one bundle draw the same tokens and are
checked against each other; the peers use their own random streams and are not compared.
--repeats N runs each (question, method) N times from the same state, keeps the median and warns where the
runs spread more than --noise (10%); the summary also warns when the bandwidth probe moved that much.

--concurrency 1,2,4,8,16: the load mode instead: Spec-Bench prompts submitted through the batching engine
(se-none, se-ngram-kK, se-recycle-kK / -kauto) and OpenVINO GenAI's continuous batching (ov-cb[-int4]
[-default][-pld]) at each concurrency, as a burst or --arrival poisson --rate R; aggregate tokens/s, time
to first token and per output token (p50, p99), every output checked against its solo run.

--ttft 60,200,800,1500: the time-to-first-token mode instead: prompts of those many tokens cut from the
Spec-Bench texts, each method generating one token (the whole prefill), --repeats rounds of the grid; every
method's first token is checked against the first method's.

Writes records.jsonl (one record per question x method, or per request), summary.md, config.json and
speedup.png (or throughput.png + latency.png) under --out; every record names the CPU model and flags.
Imports torch/transformers only for the hf* methods.
"""
from .cli import main
from .config import DEFAULT_METHODS, BenchConfig, find_questions, questions
from .runner import read_bandwidth, run, sha1

__all__ = ["DEFAULT_METHODS", "BenchConfig", "find_questions", "main", "questions", "read_bandwidth", "run", "sha1"]
