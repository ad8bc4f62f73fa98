"""The OpenAI-compatible HTTP app: routes, the request's life from body to SSE, the server's state.

`create_app(cfg, pipe=None)` -> a FastAPI (ASGI) app; with no pipe it answers 503 until `service.ready(pipe)`
(server.py loads the bundle in a thread while the port is already open). The engine runs requests in its
own threads; here everything is asyncio: each request's Completion is iterated by one pump thread that
hands pieces to the event loop, and a watcher task cancels the Completion when the client disconnects,
which frees its batch row at the engine's next step.

No uvicorn, signals or Ray here (server.py, ray_app.py); no wire formats (schemas.py); no metric
definitions (metrics.py).
"""
from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..errors import EngineClosed, PromptTooLong, QueueFull
from ..runtime import validate
from ..runtime.prefix import DEFAULT_MB
from .metrics import CONTENT_TYPE, Metrics
from .schemas import FINISH, APIError, ChatRequest, CompletionRequest, Reply, bad_request, parse, usage

log = logging.getLogger("specexport.serve")


@dataclass(frozen=True)
class ServeConfig:
    bundle: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int | None = None  # requests decoding at once (batch rows); None: the bundle's largest batch
    max_queue: int = 64  # requests waiting for a row; past that: 429
    prefill_budget: int | None = None  # prompt tokens prefilled per step while others decode (None: the engine's)
    prefix_cache_mb: float = DEFAULT_MB  # the engine's prefix cache (runtime/prefix.py); 0: off
    api_key: str | None = None  # required as "Authorization: Bearer KEY" on /v1/* when set
    model_name: str = ""  # the id clients send as "model"; "" = the bundle directory's name
    threads: int | None = None  # onnxruntime intra-op threads (None: all cores)
    max_body_bytes: int = 1 << 20  # larger request bodies: 413
    drain_timeout: float = 30.0  # on SIGTERM, how long running requests may take to finish
    retry_after_s: int = 1  # the Retry-After of a 429 / 503

    def __post_init__(self):
        if not (isinstance(self.port, int) and 0 <= self.port < 65536):
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        if self.max_batch is not None and not (isinstance(self.max_batch, int) and self.max_batch >= 1):
            raise ValueError(f"max_batch must be an integer >= 1, got {self.max_batch!r}")
        if not (isinstance(self.max_queue, int) and self.max_queue >= 0):
            raise ValueError(f"max_queue must be an integer >= 0, got {self.max_queue!r}")
        if self.prefill_budget is not None and not (isinstance(self.prefill_budget, int) and self.prefill_budget >= 1):
            raise ValueError(f"prefill_budget must be an integer >= 1, got {self.prefill_budget!r}")
        validate.prefix_cache_mb(self.prefix_cache_mb)  # the engine's own check (an OptionError is a ValueError)
        if self.max_body_bytes < 1 or self.drain_timeout < 0:
            raise ValueError("max_body_bytes must be >= 1 and drain_timeout >= 0")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (omit it to serve without a key)")

    @property
    def name(self) -> str:
        return self.model_name or Path(self.bundle).resolve().name


def load_pipeline(cfg: ServeConfig):
    """Load the bundle once and start its engine with the configured bounds."""
    from .. import load

    pipe = load(cfg.bundle, threads=cfg.threads)
    bounds = {"max_queue": cfg.max_queue} | ({"max_batch": cfg.max_batch} if cfg.max_batch else {})
    pipe.start_engine(**bounds, prefill_budget=cfg.prefill_budget, prefix_cache_mb=cfg.prefix_cache_mb)
    return pipe


class Service:
    """The server's state: loading -> ready -> draining (or failed), and what each request needs from it."""

    def __init__(self, cfg: ServeConfig, pipe=None):
        self.cfg, self.pipe, self.error = cfg, pipe, None
        self.status = "ready" if pipe is not None else "loading"
        self.metrics = Metrics(lambda: self.pipe.engine.stats() if self.pipe is not None else None)

    def ready(self, pipe) -> None:
        self.pipe, self.status = pipe, "ready"

    def failed(self, error: BaseException) -> None:
        self.error, self.status = error, "failed"

    def drain(self) -> None:
        """Stop taking requests (503); running ones go on until `close`."""
        if self.status == "ready":
            self.status = "draining"

    def busy(self) -> bool:
        """Whether the engine has requests running or queued."""
        e = self.pipe._engine if self.pipe is not None else None
        if e is None:
            return False
        st = e.stats()
        return bool(st["running"] or st["queued"])

    def close(self, timeout: float = 5.0) -> None:
        self.drain()
        if self.pipe is not None:
            self.pipe.close(timeout)

    # ---- per request
    def authorize(self, request: Request) -> None:
        key = self.cfg.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken does not depend on how much of the key matched
        if not (scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())):
            raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    def pipeline(self):
        if self.status == "ready":
            return self.pipe
        why = {"loading": "the model is still loading", "draining": "the server is shutting down",
               "failed": f"the bundle failed to load: {self.error}"}[self.status]
        raise APIError(503, why, type="server_error", code=self.status,
                       headers={"Retry-After": str(self.cfg.retry_after_s)})

    def check_model(self, model: str) -> None:
        if model != self.cfg.name:
            raise APIError(404, f"The model '{model}' does not exist: this server serves '{self.cfg.name}'",
                           param="model", code="model_not_found")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 past `limit` bytes (declared by Content-Length, or counted as it arrives)."""
    declared = request.headers.get("content-length", "")
    too_big = APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
    except ClientDisconnect:  # the client left mid-upload: nobody reads the answer, nothing to log as a bug
        raise APIError(499, "the client closed the connection before the request body was complete",
                       code="client_closed_request") from None
    return bytes(body)


# the runtime's OptionError names the argument in its message: its word -> the API's parameter, first match
_OPTION_PARAMS = (("max_new_tokens", "max_tokens"), ("verify profiles", "k"), ("k=", "k"), ("draft", "draft"),
                  ("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("seed", "seed"),
                  ("sampler", "sampler"), ("stop", "stop"), ("prompt", "{prompt}"))


def submit(svc: Service, pipe, req, chat: bool):
    """Tokenise, size, and queue one request -> Completion; every refusal is an APIError."""
    prompt_param = "messages" if chat else "prompt"
    try:
        prompt = [m.to_template(i) for i, m in enumerate(req.messages)] if chat else req.prompt_value()
        ids = pipe.encode(prompt)
    except APIError:
        raise
    except ValueError as e:  # the chat template refused the conversation, or the bundle has none
        raise bad_request(str(e), param=prompt_param) from None
    vocab = pipe.manifest.target.arch["vocab_size"]
    if not chat and isinstance(prompt, list) and max(prompt, default=0) >= vocab:
        raise bad_request(f"prompt token ids must be below the vocabulary size {vocab}", param="prompt")
    capacity = pipe.manifest.capacity
    room = capacity - len(ids)
    limit = req.limit() if req.limit() is not None else room  # chat without a limit: up to the capacity
    if limit > room or room < 1:
        asks = (f"asks for {limit} more: shorten the prompt or lower max_tokens" if req.limit() is not None
                else "leaves no room for a completion: shorten the prompt")
        raise bad_request(f"this model's maximum context length is {capacity} tokens; the request has "
                          f"{len(ids)} in the prompt and {asks}", param=prompt_param, code="context_length_exceeded")
    opts = req.engine_options() | {"max_new_tokens": limit}
    try:
        return pipe.submit(ids, stop=req.stops(), **opts)
    except QueueFull as e:
        raise APIError(429, str(e), type="rate_limit_error", code="rate_limit_exceeded",
                       headers={"Retry-After": str(svc.cfg.retry_after_s)}) from None
    except EngineClosed as e:
        raise APIError(503, str(e), type="server_error", code="draining",
                       headers={"Retry-After": str(svc.cfg.retry_after_s)}) from None
    except PromptTooLong as e:
        raise bad_request(str(e), param=prompt_param, code="context_length_exceeded") from None
    except ValueError as e:  # an option this bundle cannot honour (a k it has no profile for, no draft model)
        msg = str(e)
        param = next((p for needle, p in _OPTION_PARAMS if needle in msg), None)
        raise bad_request(msg, param=param and param.format(prompt=prompt_param)) from None


def completion_tokens(pipe, g, stops: tuple) -> int:
    """usage.completion_tokens: the tokens that produced the text, without an EOS that ended it.

    A verify step may accept tokens past a stop string; they are not counted, so the count is the same
    with every draft: only up to the token that completed the stop string."""
    ids = list(g.token_ids)
    if ids and ids[-1] in pipe.eos:
        ids.pop()
    if g.finish_reason == "stop":
        def text(n):
            return pipe.tokenizer.decode([t for t in ids[:n] if t not in pipe.eos])
        while ids and any(s in text(len(ids) - 1) for s in stops if s):
            ids.pop()
    return len(ids)


_END = object()


class Run:
    """One submitted request: a pump thread iterates the Completion into an asyncio queue and, when it
    ends, does the accounting (usage, metrics); a watcher task cancels it if the client goes away."""

    def __init__(self, svc: Service, c, request: Request, route: str, t0: float, reply: Reply, stops: tuple):
        self.svc, self.c, self.route, self.t0, self.reply, self.stops = svc, c, route, t0, reply, stops
        self.outcome, self.usage = "error", usage(len(c.generation.prompt_ids), 0)
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._watcher = asyncio.create_task(self._cancel_on_disconnect(request))
        threading.Thread(target=self._pump, name="specexport-pump", daemon=True).start()

    async def _cancel_on_disconnect(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.c.cancel()

    def _put(self, item) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone (the process is exiting)
            pass

    def _pump(self) -> None:
        t_first = None
        try:
            for piece in self.c:
                t_first = t_first or time.perf_counter()
                self._put(piece)
        finally:
            try:
                self._account(t_first)
            except Exception:  # noqa: BLE001 -- accounting must never keep the answer from ending
                log.exception("accounting failed")
            self._put(_END)

    def _account(self, t_first: float | None) -> None:
        g, pipe = self.c.generation, self.svc.pipe
        self.outcome = FINISH.get(g.finish_reason, g.finish_reason)  # cancelled / error keep their names
        self.usage = usage(len(g.prompt_ids), completion_tokens(pipe, g, self.stops), g.stats.cached_tokens)
        self.svc.metrics.finished(self.route, self.outcome, self.usage["prompt_tokens"],
                                  self.usage["completion_tokens"], g.stats,
                                  None if t_first is None else t_first - self.t0, time.perf_counter() - self.t0)

    async def pieces(self):
        try:
            while (piece := await self._queue.get()) is not _END:
                yield piece
        finally:
            self._watcher.cancel()
            self.c.cancel()  # a no-op once it has finished; frees the row if the consumer stopped early

    def failure(self) -> APIError:
        if self.outcome == "cancelled":
            return APIError(503, "the request was cancelled: the server is shutting down", type="server_error",
                            code="cancelled")
        return APIError(500, f"generation failed: {self.c.error!r}", type="server_error")

    async def whole(self) -> dict:
        async for _ in self.pieces():
            pass
        if self.outcome not in ("stop", "length"):
            raise self.failure()
        return self.reply.whole(self.c.generation.text, self.outcome, self.usage)

    async def sse(self, include_usage: bool):
        def event(body: dict) -> str:
            return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"

        r = self.reply
        if r.chat:  # OpenAI's first chunk carries the role
            yield event(r.chunk("", role=True, with_usage=include_usage))
        async for piece in self.pieces():
            yield event(r.chunk(piece, with_usage=include_usage))
        if self.outcome in ("stop", "length"):
            yield event(r.chunk(None, finish=self.outcome, with_usage=include_usage))
            if include_usage:
                yield event(r.usage_chunk(self.usage))
        else:  # the openai client raises an APIError on a data event with an "error" key
            yield event(self.failure().body())
        yield "data: [DONE]\n\n"


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


def create_app(cfg: ServeConfig, pipe=None) -> FastAPI:
    svc = Service(cfg, pipe)

    @asynccontextmanager
    async def lifespan(app):
        yield
        # uvicorn has already waited (up to the drain timeout) for open requests; cancel whatever is left
        await asyncio.to_thread(svc.close, 5.0)

    app = FastAPI(title="specexport", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = svc

    @app.exception_handler(APIError)
    async def on_api_error(request, e: APIError):
        return _error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request, e: StarletteHTTPException):  # unknown route, wrong method
        return _error_response(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                        code="not_found" if e.status_code == 404 else None))

    @app.exception_handler(Exception)
    async def on_bug(request, e: Exception):  # a bug answers 500; the server goes on
        log.exception("unhandled error on %s", request.url.path)
        return _error_response(APIError(500, f"internal error: {e!r}", type="server_error"))

    async def generate(request: Request, chat: bool):
        route, t0 = ("chat" if chat else "completions"), time.perf_counter()
        try:
            svc.authorize(request)
            pipe = svc.pipeline()
            req = parse(ChatRequest if chat else CompletionRequest, await read_body(request, cfg.max_body_bytes))
            req.check_unsupported()
            svc.check_model(req.model)
            # in a thread: the chat template and the tokeniser take ~1 s per MB of prompt, which on the event
            # loop would stall every stream and /health meanwhile
            c = await asyncio.to_thread(submit, svc, pipe, req, chat)
        except APIError as e:
            svc.metrics.refused(route, e.status)
            return _error_response(e)
        run = Run(svc, c, request, route, t0, Reply(chat, cfg.name), req.stops())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(run.sse(include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await run.whole())
        except APIError as e:
            return _error_response(e)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    def model_card() -> dict:
        return {"id": cfg.name, "object": "model", "created": int(Path(cfg.bundle).stat().st_mtime),
                "owned_by": "specexport"}

    @app.get("/v1/models")
    async def models(request: Request):
        svc.authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str):
        svc.authorize(request)
        svc.check_model(model)
        return model_card()

    @app.get("/health")
    async def health():
        """200 once the bundle is loaded and the server takes requests; 503 while loading or draining."""
        body = {"status": svc.status, "model": cfg.name, "pid": os.getpid()}  # pid: which replica answered
        if svc.status == "ready":
            return body | {"engine": svc.pipe.engine.stats()}
        return JSONResponse(body | ({"error": str(svc.error)} if svc.error else {}), status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE)

    return app
