"""The OpenAI wire format: request models, response and chunk bodies, the error shape.

Requests are pydantic models parsed from the raw body in JSON strict mode (no "5" for 5, no NaN). A field
OpenAI defines but we do not implement is declared with the one value that means "off" (n=1, logprobs=false,
...): any other value is a 400 naming it, never a silent ignore; a field OpenAI does not define is a 400 too
(extra="forbid"). Knows nothing of the engine or HTTP: `app.py` turns a request into engine options.
"""
from __future__ import annotations

import re
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# ---- errors


class APIError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# pydantic puts the member of a union it tried into an error's location ("str", "list[str]",
# "function-after[...]"): not a parameter name
_MEMBER = re.compile(r"^(str|int|float|bool|none|literal\[.*|[a-z-]+\[.*\])$", re.IGNORECASE)


def _param(loc: tuple) -> str:
    """("messages", 0, "content", "str") -> "messages[0].content" (how OpenAI names a nested parameter)."""
    out = ""
    for part in loc:
        if isinstance(part, str) and _MEMBER.match(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse(model: type[BaseModel], body: bytes) -> BaseModel:
    """Raw body -> request model, or a 400 naming the first bad parameter."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise bad_request(f"the body is not valid JSON: {err['msg']}") from None
        if err["type"] == "model_type":
            raise bad_request("the body must be a JSON object") from None
        param = _param(err["loc"])
        if err["type"] == "extra_forbidden":
            raise bad_request(f"unsupported parameter: {param}", param=param) from None
        # a union's members each refused the value: say every way it could have been right
        msgs = list(dict.fromkeys(x["msg"] for x in e.errors(include_url=False) if _param(x["loc"]) == param))
        raise bad_request(f"invalid value for {param}: {' or '.join(msgs)}", param=param) from None


# ---- requests

# OpenAI parameters we do not implement -> the values that leave them off (None = omitted is always fine)
UNSUPPORTED_UNLESS = {
    "n": (1,), "logprobs": (False,), "top_logprobs": (0,), "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0), "logit_bias": ({},), "tools": ([],), "tool_choice": ("none",),
    "functions": ([],), "function_call": ("none",), "parallel_tool_calls": (False,),
    "response_format": ({"type": "text"},), "store": (False,), "modalities": (["text"],),
    "echo": (False,), "best_of": (1,), "suffix": ("",),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    """Parameters both routes take. Defaults are OpenAI's (temperature 1, no seed = a fresh random one)."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2 ** 63)
    stop: str | list[str] | None = None
    stream: bool | None = False  # null as OpenAI allows: not streamed
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for abuse monitoring: no effect on the output
    # extra fields of ours
    top_k: int | None = Field(None, ge=-1)  # 0 or -1 = off (vLLM's spelling)
    draft: Literal["model", "ngram", "recycle", "none"] | None = None
    k: int | Literal["auto"] | None = None
    sampler: Literal["gumbel", "rejection"] | None = None
    # OpenAI's, accepted only at their "off" value (UNSUPPORTED_UNLESS)
    n: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None
    response_format: Any = None
    store: Any = None

    def check_unsupported(self) -> None:
        for name, off in UNSUPPORTED_UNLESS.items():
            v = getattr(self, name, None)
            # by type too: True == 1 and 0 == False, but n=true or logprobs=0 are not the off values
            if v is not None and not any(type(v) is type(o) and v == o for o in off):
                raise bad_request(f"{name}={v!r} is not supported by this server", param=name)
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", param="stream_options")

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def engine_options(self) -> dict:
        """The options `Pipeline.submit` takes (max_new_tokens is set by the route: it depends on the prompt)."""
        return dict(temperature=1.0 if self.temperature is None else self.temperature,
                    top_p=1.0 if self.top_p is None else self.top_p,
                    top_k=max(self.top_k or 0, 0),
                    seed=self.seed if self.seed is not None else uuid.uuid4().int >> 65,
                    draft=self.draft, k=self.k, sampler=self.sampler or "gumbel")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None
    name: str | None = None

    def to_template(self, i: int) -> dict:
        """-> {"role", "content"} for the chat template; text content parts are joined, others refused."""
        content = self.content or ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request("only text content parts are supported",
                                      param=f"messages[{i}].content[{j}]")
                texts.append(part["text"])
            content = "".join(texts)
        role = "system" if self.role == "developer" else self.role  # OpenAI's newer name for the system turn
        return {"role": role, "content": content} | ({"name": self.name} if self.name else {})


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    modalities: Any = None

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Common):
    prompt: Any  # a string, or token ids; a list of prompts only with one element (n=1 each)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    def limit(self) -> int:
        return self.max_tokens if self.max_tokens is not None else 16  # OpenAI's default for /v1/completions

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]  # a batch of one
        if isinstance(p, str):
            return p
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
            return p
        raise bad_request("prompt must be a string or a list of token ids (one prompt per request)", param="prompt")


# ---- responses


class Reply:
    """The bodies of one answer: a chat.completion or a text_completion, whole or as chunks."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None}

    def whole(self, text: str, finish: str, usage: dict) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
            return self._head("chat.completion") | {"choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._head("text_completion") | {"choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False,
              with_usage: bool = False) -> dict:
        """One streamed choice; `with_usage` adds "usage": null as OpenAI does when include_usage is set."""
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
            body = self._head("chat.completion.chunk") | {
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        else:
            body = self._head("text_completion") | {
                "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}
        return body | ({"usage": None} if with_usage else {})

    def usage_chunk(self, usage: dict) -> dict:
        """The last chunk under stream_options.include_usage: no choices, the request's usage."""
        return self._head("chat.completion.chunk" if self.chat else "text_completion") | {
            "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: prompt tokens the prefix cache held."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # the engine's words -> OpenAI's
