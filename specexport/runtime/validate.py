"""Checks at the runtime's edge: the API's arguments, and the opening of a checked bundle's models and tokenizer.

Argument checks are pure functions: each takes what a caller passed and returns it normalised (numpy
integers and floats become Python ones) or raises OptionError naming the argument, what it must be and how
to fix the call. Nothing here decides what a valid value does; the Pipeline, DecodeConfig and SamplingParams
keep their own range checks as a second line. Opening (`open_model`, `tokenizer`) turns onnxruntime's and
tokenizers' own exceptions about a bad bundle file into BundleError, and checks the graph onnxruntime loaded
against the manifest (bundle.check_graph_io), so a lying manifest fails at load, not at the first generate.
No torch here; no argparse (the CLI converts its strings first).
"""
from __future__ import annotations

import difflib
import inspect
import json
import math
import numbers
from pathlib import Path

import numpy as np

from .. import bundle
from ..backends import KINDS
from ..errors import BundleError, OptionError
from .decoder import DRAFTS
from .sampling import SAMPLERS

MAX_STOPS = 64
MAX_TOKENIZER_BYTES = 1 << 30


def _got(x) -> str:
    r = repr(x)
    return (r if len(r) <= 60 else r[:57] + "...") + f" ({type(x).__name__})"


def _hint(name: str, x) -> str:
    """A string that spells a number: say how to pass the number itself."""
    if isinstance(x, str):
        try:
            v = float(x)
        except ValueError:
            return ""
        return f": pass {name}={int(v) if v.is_integer() and '.' not in x else v} (a number, not a string)"
    return ""


def is_int(x) -> bool:
    """Python and numpy integers; never a bool (True is an int to Python, never a count or a token here)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def integer(x, name: str, lo: int, hi: int | None = None, fix: str = "") -> int:
    if not is_int(x) or x < lo or (hi is not None and x > hi):
        span = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise OptionError(f"{name} must be an integer {span}, got {_got(x)}{_hint(name, x) or fix}")
    return int(x)


def _finite(x) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past 1e308
        return False


def real(x, name: str, lo: float = -math.inf, hi: float = math.inf, lo_open: bool = False, fix: str = "") -> float:
    ok = isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and _finite(x)
    if not ok or (x <= lo if lo_open else x < lo) or x > hi:
        span = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]" if hi < math.inf else f">= {lo:g}"
        raise OptionError(f"{name} must be a finite number {span}, got {_got(x)}{_hint(name, x) or fix}")
    return float(x)


def flag(x, name: str) -> bool:
    if not isinstance(x, (bool, np.bool_)):
        raise OptionError(f"{name} must be True or False, got {_got(x)}")
    return bool(x)


def choice(x, name: str, choices, fix: str = "") -> str:
    if not isinstance(x, str) or x not in choices:
        raise OptionError(f"{name} must be one of {', '.join(choices)}, got {_got(x)}{fix}")
    return x


def text(x, name: str) -> str:
    """A str that is valid Unicode: a lone surrogate (from a bad decode) cannot be encoded as UTF-8."""
    if not isinstance(x, str):
        raise OptionError(f"{name} must be a string, got {_got(x)}")
    try:
        x.encode("utf-8")
    except UnicodeEncodeError as e:
        raise OptionError(f"{name} holds a lone surrogate {x[e.start]!r} at index {e.start} (not valid Unicode; "
                          "it usually comes from decoding bytes with errors='surrogateescape'): decode the input "
                          "with errors='replace', or drop the character") from None
    return x


# ---- the prompt

def prompt(x, vocab: int):
    """-> ("text", str) | ("ids", [int]) | ("messages", [{"role", "content", ...}]). Token ids are Python or
    numpy integers in [0, vocab); a 1-D integer numpy array counts as a list of them."""
    if isinstance(x, str):
        return "text", text(x, "prompt")
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iu":
        x = x.tolist()
    if not isinstance(x, (list, tuple)):
        fix = {bytes: ": decode it first (prompt.decode('utf-8'))", dict: ": a chat message goes in a list: "
               "[{'role': 'user', 'content': ...}]"}.get(type(x), "")
        raise OptionError(f"prompt must be a string, a list of token ids or a list of chat messages "
                          f"({{'role': ..., 'content': ...}}), got {_got(x)}{fix}")
    if not x:
        raise OptionError("the prompt is empty: pass some text, token ids or chat messages")
    if all(isinstance(t, str) for t in x):
        raise OptionError(f"prompt is a list of {len(x)} strings, which is neither one prompt nor chat messages: "
                          "pass one string per call (pipe.submit queues many), or chat messages as "
                          "[{'role': 'user', 'content': ...}]")
    if isinstance(x[0], dict):
        return "messages", messages(x)
    ids = []
    for i, t in enumerate(x):
        if not is_int(t) or not 0 <= t < vocab:
            raise OptionError(f"prompt[{i}] must be a token id, an integer in [0, {vocab}) (the bundle's "
                              f"vocabulary), got {_got(t)}")
        ids.append(int(t))
    return "ids", ids


def messages(x) -> list[dict]:
    for i, m in enumerate(x):
        if not isinstance(m, dict):
            raise OptionError(f"chat message {i} must be a dict with 'role' and 'content', got {_got(m)}")
        for key in ("role", "content"):
            if key not in m:
                raise OptionError(f"chat message {i} has no {key!r}: each message is {{'role': 'user' | "
                                  f"'assistant' | 'system', 'content': '...'}}")
            text(m[key], f"chat message {i} {key!r}")
        if not m["role"]:
            raise OptionError(f"chat message {i} has an empty 'role'")
    return list(x)


def stop(x) -> tuple[str, ...]:
    """None -> no stop strings; one str is ONE stop string (not its characters); else a list of them."""
    if x is None:
        return ()
    items = (x,) if isinstance(x, str) else x
    if not isinstance(items, (list, tuple)) or len(items) > MAX_STOPS:
        raise OptionError(f"stop must be a string, a list of at most {MAX_STOPS} strings, or None, got {_got(x)}")
    for i, s in enumerate(items):
        text(s, f"stop[{i}]")
        if not s:
            raise OptionError(f"stop[{i}] is empty (it would stop before the first token): leave it out")
    return tuple(items)


# ---- generation options (Pipeline.config's arguments, in its order)

def options(max_new_tokens, k, draft, temperature, top_k, top_p, seed, sampler, ngram) -> tuple:
    max_new_tokens = integer(max_new_tokens, "max_new_tokens", 1, bundle.MAX_CAPACITY)
    if not (k is None or isinstance(k, str) and k == "auto"):
        k = integer(k, "k", 1, 4096, fix=": a draft length such as k=4 (one of the bundle's verify profiles), "
                    "or k='auto'")
    if draft is not None:
        draft = choice(draft, "draft", DRAFTS)
    temperature = real(temperature, "temperature", 0.0, fix=" (0 = greedy)")
    top_k = integer(top_k, "top_k", 0, fix=" (0 = off)")
    top_p = real(top_p, "top_p", 0.0, 1.0, lo_open=True, fix=" (1 = off)")
    seed = integer(seed, "seed", 0, 2 ** 63 - 1)
    sampler = choice(sampler, "sampler", SAMPLERS)
    ngram = integer(ngram, "ngram", 1, 64)
    return max_new_tokens, k, draft, temperature, top_k, top_p, seed, sampler, ngram


def option_names(opts: dict, fn) -> None:
    """Keyword options `fn` does not take (a typo) as OptionError, not Python's TypeError."""
    known = [p for p in inspect.signature(fn).parameters if p != "self"]
    for name in opts:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise OptionError(f"unknown option {name!r}" + (f": did you mean {close[0]!r}?" if close else
                              f"; options are {', '.join(known)}"))


def load_args(threads, verify, backend, device) -> tuple:
    if threads is not None:
        threads = integer(threads, "threads", 1, 1024, fix=" (None = all cores)")
    return threads, flag(verify, "verify"), choice(backend, "backend", KINDS), text(device, "device")


# ---- opening a checked bundle's files

def _foreign(e: BaseException) -> bool:
    return type(e).__module__.startswith(("onnxruntime", "tokenizers"))


def _dtype(ort_type: str) -> str:
    t = ort_type[len("tensor("):-1] if ort_type.startswith("tensor(") else ort_type
    return {"float": "float32", "double": "float64"}.get(t, t)


def open_model(make, entry: bundle.ModelEntry):
    """make(entry) -> a backend, with onnxruntime's refusals of the graph as BundleError and the loaded graph's
    I/O checked against the manifest (onnxruntime backends; others check their own)."""
    try:
        model = make(entry)
    except Exception as e:
        if not _foreign(e):
            raise
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise BundleError(f"{entry.graph} (models.{entry.role}.graph) cannot be loaded by onnxruntime "
                          f"({type(e).__name__}: {first}): rebuild the bundle") from None
    session = getattr(model, "session", None)
    if session is not None and hasattr(session, "get_inputs"):
        io = lambda xs: [(x.name, x.shape, _dtype(x.type)) for x in xs]  # noqa: E731
        bundle.check_graph_io(entry, io(session.get_inputs()), io(session.get_outputs()))
    return model


def tokenizer(root: Path, m: bundle.Manifest):
    """The bundle's tokenizer (read with a bound, parsed from memory), whose ids all fit the model's vocabulary."""
    from tokenizers import Tokenizer

    name = m.tokenizer["file"]
    data = bundle.read_bytes(root, name, m.sizes.get(name, MAX_TOKENIZER_BYTES))
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception for a malformed file
        raise BundleError(f"tokenizer file {name} (tokenizer.file) cannot be loaded ({type(e).__name__}: "
                          f"{str(e)[:200]}): rebuild the bundle") from None
    V = m.target.arch["vocab_size"]
    n = tok.get_vocab_size(with_added_tokens=True)
    if n > V:
        raise BundleError(f"tokenizer file {name} has {n} tokens but the target's vocabulary "
                          f"(models.target.arch.vocab_size) is {V}: rebuild the bundle")
    # ids can be sparse: the count fitting says nothing of the largest id, which the target would be fed
    top = max(tok.get_vocab(with_added_tokens=True).values(), default=0)
    special = max(_ints(json.loads(data).get("post_processor")), default=0)  # the ids it adds (bos, sep, ...)
    if max(top, special) >= V:
        raise BundleError(f"tokenizer file {name} has token id {max(top, special)}, past the target's vocabulary "
                          f"of {V} (models.target.arch.vocab_size): rebuild the bundle")
    return tok


def successors(root: Path, m: bundle.Manifest):
    """The bundle's seeded successor table (the recycle drafter's, build-time), or None when it has none."""
    import io

    from .drafters import SuccessorTable

    if not m.successors:
        return None
    name, V = m.successors["file"], m.target.arch["vocab_size"]
    data = bundle.read_bytes(root, name, m.sizes.get(name, MAX_TOKENIZER_BYTES))
    try:
        return SuccessorTable.from_array(np.load(io.BytesIO(data), allow_pickle=False), V)
    except (ValueError, EOFError, OSError) as e:  # np.load's for a foreign or truncated file, from_array's
        raise BundleError(f"successor table {name} (successors.file) cannot be loaded: {e}: rebuild the bundle, "
                          "or rebuild it with --seed-tokens 0 for none") from None


def _ints(x) -> list:
    """Every integer in a parsed JSON value."""
    if isinstance(x, dict):
        return [i for v in x.values() for i in _ints(v)]
    if isinstance(x, list):
        return [i for v in x for i in _ints(v)]
    return [x] if type(x) is int else []


def prefix_cache_mb(x) -> float:
    """The engine's prefix cache in MiB: a finite number >= 0 (0: off), at most 1 TiB."""
    return real(x, "prefix_cache_mb", 0.0, 2.0 ** 20, fix=" (0 turns the prefix cache off)")
