"""Chat templates: a bundle's jinja template rendered as transformers' apply_chat_template(tokenize=False)
renders it, with limits on time, output size and work.

What lives here: `ChatTemplate` (compiled once, rendered any number of times, from any thread), the names
transformers gives a template (the `tojson` filter with its ensure_ascii=False/indent/separators, `raise_exception`,
`strftime_now`, a `dict` and a `namespace` that refuse dunders, loop controls, `{% generation %}`), the
preparation of messages/tools/documents it applies (None-valued keys dropped, plain JSON types only, reasoning
aliases), and the guards. What must not: torch, transformers, tokens; nothing here knows about models.

A template is untrusted code. Jinja's sandbox keeps it from Python's internals; the guards keep it from time
and memory. One render may run `max_seconds`, emit `max_chars` characters, and compute WORK_FACTOR x
max_chars characters in all (the results of `+ * ** %`, `~`, calls and filters, and every emitted piece,
macro bodies and set blocks included, are charged). A template cannot catch exceptions, so a guard stops it
by raising TemplateError from inside the hook it is running in: no signals, no threads. Where they are checked:
- time: every attribute/item access, `+ * ** %`, call, filter, emitted piece and loop iteration;
- size: operations whose result can outgrow their inputs without bound (`*`, `**`, `%`, str.replace/join/
  format/center..., the filters replace/join/indent/wordwrap/format/center/batch/slice/tojson/urlize/sum)
  are priced before they run; anything else may grow its inputs by a bounded factor (upper() or escape()
  at most 6x) and is measured after. No value a template handles may exceed max_chars, and an integer may
  not exceed MAX_INT_DIGITS digits (CPython's own limit for printing one). Values are measured by a walk that
  stops at its cap, so a list shared 2**60 times costs no more to measure than a short one.
To check every loop and every emitted piece, the parsed template is rewritten before it compiles: loop
iterables pass through a ticking generator, `~` through a priced join, and literal text through finalize.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
import time
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import datetime

import jinja2
import jinja2.ext
import numpy as np
from jinja2 import nodes
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from ..errors import OptionError, TemplateError

MAX_CHARS = 1 << 20  # default output limit; a prompt that fits a cache of a few thousand tokens is far smaller
MAX_SECONDS = 1.0
WORK_FACTOR = 16  # characters a render may compute, as a multiple of max_chars
MAX_SOURCE_CHARS = 1 << 16  # real templates are 1-20k characters; compiling cannot be interrupted (64k: ~1.5 s)
MAX_INT_DIGITS = 4300  # sys.int_info.default_max_str_digits: a larger int cannot even be printed
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' names for a message's reasoning

_active: ContextVar = ContextVar("specexport_chat_guard", default=None)  # the running render's _Guard
_END = object()


class _NotRendering(Exception):
    """A hook called by jinja's compile-time constant folding: the expression is evaluated at render time."""


@dataclasses.dataclass
class _Guard:
    max_chars: int
    max_seconds: float
    deadline: float
    budget: int  # characters this render may still compute

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"the chat template ran longer than {self.max_seconds:g} s and was stopped")

    def charge(self, chars: int) -> None:
        self.budget -= chars
        if self.budget < 0:
            raise TemplateError(f"the chat template computes more than {WORK_FACTOR} x {self.max_chars} "
                                "characters and was stopped")

    def bound(self, *values) -> int:
        """Refuses inputs of more than max_chars characters together; their size otherwise."""
        n = sum(_size(v, self.max_chars) for v in values)
        if n > self.max_chars:
            raise TemplateError(f"the chat template handles a value of more than {self.max_chars} characters")
        return n

    def take(self, value) -> None:
        """A value the template made (or emits): bounded like an input, and charged."""
        self.charge(self.bound(value))


def _guard() -> _Guard:
    g = _active.get()
    if g is None:
        raise _NotRendering()
    return g


def _shape(x, cap: int) -> tuple[int, int, int]:
    """(characters, nodes, depth) of x printed or dumped as JSON, a part shared n times counted n times.
    Stops once the characters pass cap; a container counts 2 characters per element before its elements are
    visited (lazily), so the cost is bounded by cap, not by x."""
    if type(x) is str or type(x) is bytes:  # the common case, without the walk's setup
        return len(x) + 2, 1, 1
    chars = count = depth = 0
    stack = [(iter((x,)), 1)]  # (iterator over a container's elements, their depth)
    while stack and chars <= cap:
        it, d = stack[-1]
        v = next(it, _END)
        if v is _END:
            stack.pop()
            continue
        count += 1
        depth = max(depth, d)
        if isinstance(v, (str, bytes)):
            chars += len(v) + 2  # + quotes
        elif isinstance(v, (list, tuple)):
            chars += 2 + 2 * len(v)  # brackets, ", "
            stack.append((iter(v), d + 1))
        elif isinstance(v, dict):
            chars += 2 + 4 * len(v)  # braces, ": ", ", "
            stack.append((itertools.chain.from_iterable(v.items()), d + 1))
        elif isinstance(v, Namespace):
            stack.append((iter((object.__getattribute__(v, "_Namespace__attrs"),)), d))
        elif isinstance(v, range):
            chars += 2 + 8 * len(v)
        elif isinstance(v, bool) or v is None:
            chars += 5
        elif isinstance(v, int):
            chars += _digits(v)
        else:
            chars += 8  # floats, undefined, macros, loop objects, iterators: short reprs
    return chars, count, depth


def _size(x, cap: int) -> int:
    return _shape(x, cap)[0]


def _digits(n: int) -> int:
    return int(n.bit_length() * 0.30103) + 1  # decimal digits of |n|, at most one too many


def _ints(*values) -> int:
    """Sum of the top-level integers (widths, counts) among values and inside tuples/lists/dicts of them."""
    flat = [e for v in values for e in (v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple))
                                       else (v,))]
    return sum(abs(e) for e in flat if isinstance(e, int))


def _widths(fmt: str) -> int:
    """Upper bound of the widths and precisions written in a format string: every run of digits."""
    return sum(int(r) if len(r) < 10 else 10 ** 10 for r in re.findall(r"\d+", fmt))


def _str(x) -> str:
    return x if isinstance(x, (str, bytes)) else str(x)  # its inputs are bounded, so str() is too


def _listed(x):
    return x if isinstance(x, (str, list, tuple, dict)) else list(x)  # a generator is priced once it exists


# ---- prices: an upper bound of the characters an operation produces, computed before it runs
_ALL = 1 << 62  # walk without a cap: the guard bounded these operands before pricing them
def _printf_size(fmt: str, args) -> int:
    # each %-conversion prints at most its width or any argument, all of them for a mapping
    return len(fmt) + _widths(fmt) + _ints(args) + fmt.count("%") * _size(args, _ALL)


def _brace_size(fmt: str, *args, **kwargs) -> int:
    return len(fmt) + _widths(fmt) + _ints(args, kwargs) + fmt.count("{") * _size((args, kwargs), _ALL)


def _replace_size(s, old, new, count=-1) -> int:
    s, old, new = _str(s), _str(old), _str(new)
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(0, len(new) - len(old))


def _width_size(s, width=80, *args) -> int:
    return max(len(_str(s)), width if isinstance(width, int) else 0)


def _expandtabs_size(s, tabsize=8) -> int:
    return len(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(tabsize, 0)


def _str_join_size(sep, items) -> int:
    return _size(items, _ALL) + max(len(items) - 1, 0) * len(sep)


def _format_map_size(fmt, mapping) -> int:
    return _brace_size(fmt, **mapping) if isinstance(mapping, Mapping) else len(fmt)


STR_METHOD_SIZES = {  # methods of str and bytes whose result can outgrow the string and its arguments
    "center": _width_size, "ljust": _width_size, "rjust": _width_size, "zfill": _width_size,
    "expandtabs": _expandtabs_size, "replace": _replace_size, "join": _str_join_size, "format": _brace_size,
    "format_map": _format_map_size,
    "translate": lambda s, table: len(s) * max(1, _size(table, _ALL)),
}


def _join_size(items, d="", attribute=None) -> int:
    return _size(items, _ALL) + max(len(items) - 1, 0) * len(_str(d))


def _indent_size(s, width=4, first=False, blank=False) -> int:
    s = _str(s)
    return len(s) + (s.count("\n") + 1) * (width if isinstance(width, int) else len(_str(width)))


def _wordwrap_size(s, width=79, break_long_words=True, wrapstring=None, break_on_hyphens=True) -> int:
    s = _str(s)
    return len(s) + (len(s) + 1) * len(_str(wrapstring or "\n"))


def _fill_size(value, rows, fill_with=None) -> int:  # batch(linecount, fill_with), slice(slices, fill_with)
    return _size(value, _ALL) + (rows if isinstance(rows, int) else 0) * (2 + _size(fill_with, _ALL))


def _tojson_size(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> int:
    chars, count, depth = _shape(x, _ALL)
    step = indent if isinstance(indent, int) else len(_str(indent)) if indent else 0
    seps = sum(len(_str(s)) for s in separators) if isinstance(separators, (list, tuple)) else 2
    return 6 * chars + count * (seps + 1 + step * depth)  # \uXXXX at worst; a line per node, indented


def _urlize_size(value, trim_url_limit=None, nofollow=False, target=None, rel=None, extra_schemes=None) -> int:
    s = _str(value)  # a link per 4 characters at most, each printed twice inside its <a> tag
    return 3 * len(s) + (len(s) // 4 + 1) * (64 + len(_str(target or "")) + len(_str(rel or "")))


def _sum_size(items, attribute=None, start=0) -> int:
    # numbers add up in constant space; lists concatenated one by one copy n times
    return 0 if isinstance(start, (int, float)) else len(items) * (_size((items, start), _ALL))


FILTER_SIZES = {
    "replace": _replace_size, "join": _join_size, "indent": _indent_size, "wordwrap": _wordwrap_size,
    "format": lambda value, *args, **kwargs: _printf_size(_str(value), kwargs or args), "center": _width_size,
    "batch": _fill_size, "slice": _fill_size, "tojson": _tojson_size, "urlize": _urlize_size, "sum": _sum_size,
}


def _binop_size(op: str, a, b) -> int:
    ints = isinstance(a, int) and isinstance(b, int)
    if op == "**":
        if ints and b > 0 and abs(a) > 1:
            if b * math.log10(abs(a)) > MAX_INT_DIGITS:
                raise TemplateError(f"the chat template computes a number of more than {MAX_INT_DIGITS} digits")
            return int(b * math.log10(abs(a)))
        return 0  # floats overflow with an error of their own
    if op == "*":
        if ints:
            if _digits(a) + _digits(b) > MAX_INT_DIGITS:
                raise TemplateError(f"the chat template computes a number of more than {MAX_INT_DIGITS} digits")
            return _digits(a) + _digits(b)
        seq, n = (a, b) if isinstance(b, int) else (b, a) if isinstance(a, int) else (None, 0)
        if isinstance(seq, (str, bytes)):
            return len(seq) * max(n, 0)
        return (_size(seq, _ALL) - 2) * max(n, 0) if isinstance(seq, (list, tuple)) else 0
    if op == "+":
        return 0 if isinstance(a, (int, float)) and isinstance(b, (int, float)) else _size(a, _ALL) + _size(b, _ALL)
    if op == "%" and isinstance(a, str):
        return _printf_size(a, b)
    return 0


# ---- the environment
class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})  # also keeps them from being folded at compile time

    def call_binop(self, context, operator, left, right):
        g = _guard()
        g.tick()
        if operator == "+" and type(left) is str and type(right) is str:  # most of what templates compute
            joined = left + right  # at most the size of its operands
            g.take(joined)
            return joined
        g.bound(left, right)  # the prices walk their operands: bounded first
        g.charge(_binop_size(operator, left, right))
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj, attribute):
        _guard().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _guard().tick()
        return super().getitem(obj, argument)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        g = _guard()
        g.tick()
        fn = getattr(__obj, "__wrapped__", __obj)  # the sandbox hands out str.format wrapped
        owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", None)
        price = STR_METHOD_SIZES.get(name) if isinstance(owner, (str, bytes)) else None
        if price is _str_join_size and args:
            args = (_listed(args[0]), *args[1:])
        g.bound(owner, args, kwargs)
        if price is not None:
            g.charge(price(owner, *args, **kwargs))
        result = super().call(__context, __obj, *args, **kwargs)
        if price is None:
            g.take(result)
        return result


def _guarded_filter(name: str, f):
    """f with the guards around it; jinja's pass_context/eval_context/environment argument passed through."""
    price = FILTER_SIZES.get(name)
    first = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)  # keeps jinja_pass_arg
    def run(*args, **kwargs):
        g = _guard()
        g.tick()
        value, rest = args[first], args[first + 1:]
        if name in ("join", "sum"):
            value = _listed(value)
        g.bound(value, rest, kwargs)
        if price is not None:
            g.charge(price(value, *rest, **kwargs))
        result = f(*args[:first], value, *rest, **kwargs)
        if price is None:
            g.take(result)
        return result
    return run


def _emit(value):
    """finalize: every piece a template outputs, at any depth (macros, set blocks), passes here."""
    g = _guard()
    g.tick()
    n = len(value) if isinstance(value, str) else _size(value, g.max_chars)
    if n > g.max_chars:
        raise TemplateError(f"the chat template's output exceeds {g.max_chars} characters")
    g.charge(n)
    return value


@jinja2.pass_context
def _iterate(context, iterable):
    g = _guard()
    for item in iterable:
        g.tick()
        yield item


@jinja2.pass_context
def _concat(context, parts):
    g = _guard()
    g.tick()
    g.take(parts)
    return markup_join(parts) if context.eval_ctx.autoescape else str_join(parts)


class _Rewrite(NodeTransformer):
    """The hooks jinja has no option for: loops, `~`, and literal text (otherwise constant, never finalized)."""

    def visit_For(self, node):
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "<iterate>", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        parts = nodes.Tuple(node.nodes, "load", lineno=node.lineno)
        return nodes.Filter(parts, "<concat>", [], [], None, None, lineno=node.lineno)

    def visit_TemplateData(self, node):
        # TemplateData's own semantics (Markup under autoescape), but not constant, so it reaches finalize
        return nodes.MarkSafeIfAutoescape(nodes.Const(node.data, lineno=node.lineno), lineno=node.lineno)


class _Generation(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %} (it marks assistant tokens for training): the body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


# ---- what transformers gives a template (chat_template_utils._cached_compile_jinja_template)
def _raise_exception(message):
    raise TemplateError(str(message))


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict` for templates: builds dicts, exposes nothing of the type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(Namespace):
    """`namespace` for templates: no underscore-prefixed attributes (the way into CPython's internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise TemplateError(f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                                f"got {name!r}")


def _environment() -> _Environment:
    env = _Environment(trim_blocks=True, lstrip_blocks=True, finalize=_emit,
                       extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _guarded_filter(name, f) for name, f in env.filters.items()}
    env.filters["<iterate>"], env.filters["<concat>"] = _iterate, _concat  # names a template cannot write
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                       namespace=_TemplateNamespace)
    del env.globals["lipsum"]  # random text (never reproducible) of any length
    return env


# ---- inputs, prepared as transformers prepares them (render_jinja_template)
def _plain(value):
    """Plain JSON-like data only: the sandbox does not know the methods of rich objects (arrays, images)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models, e.g. OpenAI SDK messages
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(messages) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise OptionError(f"chat messages must be a non-empty list of dicts, got {messages!r:.80}")
    out = []
    for m in messages:
        m = _plain(m)
        if not isinstance(m, dict):
            raise OptionError(f"a chat message must be a dict with 'role' and 'content', got {m!r:.80}")
        m = {k: v for k, v in m.items() if v is not None}  # APIs send content=None; templates expect no key
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:  # templates read reasoning_content; gpt-oss reads thinking
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def _dicts(what: str, items):
    if items is None:
        return None
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, Mapping) for t in items):
        raise OptionError(f"{what} must be a list of dicts (JSON schemas for tools), got {items!r:.80}")
    return _plain(items)


class ChatTemplate:
    """A chat template compiled once; render() is thread-safe (each render's guard lives in a ContextVar)."""

    def __init__(self, source: str, special_tokens: dict | None = None, max_chars: int = MAX_CHARS,
                 max_seconds: float = MAX_SECONDS):
        if not isinstance(source, str) or not source:
            raise TemplateError("the chat template must be a non-empty string")
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateError(f"the chat template is {len(source)} characters long; at most {MAX_SOURCE_CHARS}")
        self.max_chars, self.max_seconds = int(max_chars), float(max_seconds)
        # transformers passes its special tokens (bos_token, eos_token, ...) as template variables
        self.special_tokens = {k: _plain(v) for k, v in (special_tokens or {}).items() if isinstance(k, str)}
        env = _environment()
        try:
            tree = env.parse(source)
            _Rewrite().visit(tree)
            self._template = env.from_string(tree.set_environment(env))
        except Exception as e:  # syntax errors, unknown filters, parser recursion
            raise TemplateError(f"the chat template does not compile ({type(e).__name__}: {e})") from None

    def render(self, messages, add_generation_prompt: bool = True, tools=None, documents=None, **extra) -> str:
        """The prompt text, exactly as apply_chat_template(messages, tools=tools, documents=documents,
        add_generation_prompt=..., tokenize=False, **extra) gives it (whose add_generation_prompt defaults to
        False: a runtime renders prompts to answer). Tools are JSON schemas; `extra` become template variables
        (date_string, enable_thinking, ...). Bad inputs raise OptionError, the template's refusals and the
        limits TemplateError."""
        try:
            context = {**self.special_tokens, **_plain(extra), "messages": _messages(messages),
                       "tools": _dicts("tools", tools), "documents": _dicts("documents", documents),
                       "add_generation_prompt": add_generation_prompt}  # the inputs win over any token name
        except RecursionError:
            raise OptionError("chat messages nest too deeply") from None
        g = _Guard(self.max_chars, self.max_seconds, time.monotonic() + self.max_seconds,
                   WORK_FACTOR * self.max_chars)
        token = _active.set(g)
        try:
            pieces, n = [], 0
            for piece in self._template.generate(context):
                n += len(piece)
                if n > self.max_chars:
                    raise TemplateError(f"the chat template's output exceeds {self.max_chars} characters")
                pieces.append(piece)
            return "".join(pieces)
        except TemplateError:
            raise
        except Exception as e:  # undefined names, type errors, recursion, SecurityError: the template's fault
            raise TemplateError(f"the chat template failed on these messages ({type(e).__name__}: {e})") from e
        finally:
            _active.reset(token)
