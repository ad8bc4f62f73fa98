"""`specexport serve`: a real server on a free loopback port, driven by the official openai client.

One tiny bundle (the conftest target, no draft model, capacity 1024 so that a plain-decoded request runs
~1 s: long enough to disconnect from or to SIGTERM mid-way). In-process servers run uvicorn in a thread;
the shutdown test runs `specexport serve` as a subprocess.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

openai = pytest.importorskip("openai", reason="the serve tests need the openai client: pip install '.[test]'")
pytest.importorskip("fastapi", reason="the serve tests need the serve extra: pip install '.[serve]'")

import specexport  # noqa: E402
from conftest import build_bundle  # noqa: E402
from specexport.runtime import Generation  # noqa: E402
from specexport.serve import ServeConfig, create_app  # noqa: E402
from specexport.serve.app import completion_tokens  # noqa: E402

LONG = 900  # new tokens of a request that must still be running after its first chunk (~1 s plain)
HI = [{"role": "user", "content": "Hi there, how are you?"}]


@pytest.fixture(scope="module")
def bundle(ckpts, tmp_path_factory):
    out = tmp_path_factory.getbasetemp() / "serve" / "tiny"  # built once a run: test_serve_ray.py takes it too
    if not (out / "manifest.json").is_file():
        # no draft model: draft="model" is a 400 here
        build_bundle(out, ckpts["target"], capacity=1024, batch_sizes=(1, 4))
    return out


@contextmanager
def running(app):
    """Serve `app` on a free loopback port in a thread -> base URL; shuts it down (lifespan included) after."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not server.started:
        assert t.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        t.join(15)


def serve_pipe(bundle, max_batch=4, max_queue=64, **cfg):
    pipe = specexport.load(bundle)
    pipe.start_engine(max_batch=max_batch, max_queue=max_queue)
    return create_app(ServeConfig(bundle=str(bundle), max_batch=max_batch, max_queue=max_queue, **cfg), pipe=pipe)


def client(url, key="none"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


def get(url) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(url, name) -> float:
    """One sample of /metrics, e.g. 'specexport_running_requests' or 'specexport_requests_total{outcome=...}'."""
    for line in get(url + "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def pipe(bundle):
    return specexport.load(bundle)  # the reference: solo generations, no server


@pytest.fixture(scope="module")
def url(bundle):
    with running(serve_pipe(bundle)) as u:
        yield u


@pytest.fixture(scope="module")
def narrow(bundle):
    """One row, no queue: a second request while one runs is a 429."""
    with running(serve_pipe(bundle, max_batch=1, max_queue=0)) as u:
        yield u


def test_usage_counts_the_prompt_tokens_the_prefix_cache_held(url, pipe):
    """A system prompt that an earlier request sent: the second request's prompt starts with it, the engine takes
    its K/V from the prefix cache, and usage says so as OpenAI does (prompt_tokens_details.cached_tokens)."""
    c = client(url)
    system = {"role": "system", "content": "You answer in one short line, always politely."}
    asks = [[system, {"role": "user", "content": q}] for q in ("Hi there.", "What is 2 + 2?")]
    rs = [c.chat.completions.create(model="tiny", messages=m, max_tokens=8, temperature=0) for m in asks]
    assert rs[0].usage.prompt_tokens_details.cached_tokens == 0
    shared = len(os.path.commonprefix([pipe.encode(m) for m in asks]))
    assert rs[1].usage.prompt_tokens_details.cached_tokens == shared > 16
    assert rs[1].choices[0].message.content == pipe.generate(asks[1], max_new_tokens=8, draft="none").text


def test_chat_and_completions_streamed_and_not_equal_solo_greedy(url, pipe):
    c = client(url)
    ref = pipe.generate(HI, max_new_tokens=24, draft="none")
    r = c.chat.completions.create(model="tiny", messages=HI, max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text and r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_ids), 24)
    assert r.usage.total_tokens == len(ref.prompt_ids) + 24

    chunks = list(c.chat.completions.create(model="tiny", messages=HI, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ref.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24  # the usage chunk
    assert all(ch.usage is None for ch in chunks[:-1])

    ref = pipe.generate("Once upon a time", max_new_tokens=16, draft="none")
    r = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=16, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == ref.text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_ids), 16)
    chunks = list(c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=16, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == ref.text and chunks[-1].choices[0].finish_reason == "length"
    # token ids as the prompt; a batch of one; OpenAI's default of 16 tokens for /v1/completions
    r = c.completions.create(model="tiny", prompt=[ref.prompt_ids], temperature=0)
    assert r.choices[0].text == ref.text and r.usage.prompt_tokens == len(ref.prompt_ids)
    assert [m.id for m in c.models.list().data] == ["tiny"] and c.models.retrieve("tiny").id == "tiny"


@pytest.mark.parametrize("draft", ["ngram", "recycle", "none"])
def test_stop_strings_cut_text_and_count_tokens_up_to_the_stop(url, pipe, draft):
    full = pipe.generate(HI, max_new_tokens=40, draft="none")
    stop = full.text[12:14]
    want = full.text[:full.text.find(stop)]
    # the fewest tokens whose text holds the stop string: what usage counts, whatever the draft accepted past it
    n = next(n for n in range(1, 41) if stop in pipe.tokenizer.decode(full.token_ids[:n]))
    c = client(url)
    r = c.chat.completions.create(model="tiny", messages=HI, max_tokens=40, temperature=0, stop=[stop, "@@"],
                                  extra_body={"draft": draft})
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (want, "stop")
    assert r.usage.completion_tokens == n
    chunks = list(c.chat.completions.create(model="tiny", messages=HI, max_tokens=40, temperature=0, stop=stop,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"draft": draft}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == n


def test_same_seed_same_text_with_every_draft_and_without_speculation(url):
    c = client(url)
    texts = set()
    for draft, k in [("none", None), ("ngram", 1), ("ngram", 4), ("recycle", None), ("recycle", 2)]:
        extra = {"draft": draft} | ({"k": k} if k else {})
        r = c.chat.completions.create(model="tiny", messages=HI, max_tokens=32, temperature=0.9, top_p=0.95,
                                      seed=11, extra_body=extra | {"top_k": 40})
        texts.add(r.choices[0].message.content)
        s = c.chat.completions.create(model="tiny", messages=HI, max_tokens=32, temperature=0.9, top_p=0.95,
                                      seed=11, stream=True, extra_body=extra | {"top_k": 40})
        texts.add("".join(ch.choices[0].delta.content or "" for ch in s))
    assert len(texts) == 1
    other = c.chat.completions.create(model="tiny", messages=HI, max_tokens=32, temperature=0.9, top_p=0.95,
                                      seed=12, extra_body={"top_k": 40})
    assert other.choices[0].message.content not in texts


def test_completion_tokens_leave_out_the_eos_and_whatever_followed_a_stop(pipe):
    ids = pipe.encode("abcdef", chat=False)[1:]  # one token per character (the test tokenizer), no BOS
    eos = next(iter(pipe.eos))
    assert completion_tokens(pipe, Generation(token_ids=ids + [eos], finish_reason="eos"), ()) == len(ids)
    assert completion_tokens(pipe, Generation(token_ids=ids, finish_reason="length"), ()) == len(ids)
    # the stop "cd" is complete at the 4th token; a verify step had also accepted "ef"
    assert completion_tokens(pipe, Generation(token_ids=ids, finish_reason="stop"), ("xy", "cd")) == 4


BAD_CHAT = [  # (create() keyword arguments, the parameter the 400 must name)
    (dict(n=2), "n"), (dict(logprobs=True), "logprobs"), (dict(top_logprobs=3), "top_logprobs"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "tools"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(presence_penalty=0.5), "presence_penalty"),
    (dict(logit_bias={"5": 3}), "logit_bias"), (dict(extra_body={"frobnicate": 1}), "frobnicate"),
    (dict(temperature=3), "temperature"), (dict(top_p=0), "top_p"), (dict(max_tokens=0), "max_tokens"),
    (dict(seed=-1), "seed"), (dict(extra_body={"top_k": -5}), "top_k"), (dict(extra_body={"draft": "magic"}), "draft"),
    (dict(extra_body={"k": 3, "draft": "ngram"}), "k"), (dict(extra_body={"draft": "model"}), "draft"),
    (dict(stream_options={"include_usage": True}), "stream_options"),
    (dict(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0]"),
    (dict(messages=[]), "messages"), (dict(max_tokens=1000), "messages"),
    # a union's member ("str", "int") is not part of the parameter's name; True == 1 is not n=1
    (dict(messages=[{"role": "user", "content": 5}]), "messages[0].content"), (dict(stop=5), "stop"),
    (dict(extra_body={"k": "x"}), "k"), (dict(n=True), "n"), (dict(logprobs=0), "logprobs"),
]


@pytest.mark.parametrize("kwargs,param", BAD_CHAT, ids=[p for _, p in BAD_CHAT])
def test_unsupported_or_bad_parameters_are_a_400_naming_them(url, kwargs, param):
    kwargs = {"model": "tiny", "messages": HI, "max_tokens": 8} | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client(url).chat.completions.create(**kwargs)
    assert e.value.status_code == 400 and e.value.param == param, e.value.body
    assert e.value.type == "invalid_request_error"


@pytest.mark.parametrize("kwargs,param", [(dict(prompt=["a", "b"]), "prompt"), (dict(echo=True), "echo"),
                                          (dict(best_of=2), "best_of"), (dict(suffix="x"), "suffix"),
                                          (dict(prompt=[[1, 2], [3]]), "prompt"), (dict(max_tokens=2000), "prompt"),
                                          (dict(prompt=[5, 99999]), "prompt")])
def test_completions_refusals(url, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client(url).completions.create(**({"model": "tiny", "prompt": "Hi"} | kwargs))
    assert e.value.param == param


def test_messages_of_refusals(url):
    """A union parameter's 400 names every form it takes; a prompt with no room left says so without a
    negative count; "stream": null is not streamed, as OpenAI allows."""
    def post(body):
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
    code, body = post({"model": "tiny", "messages": HI, "k": "x"})
    assert code == 400 and "auto" in body["error"]["message"] and "integer" in body["error"]["message"], body
    code, body = post({"model": "tiny", "messages": [{"role": "user", "content": "a " * 1500}]})
    assert code == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "-" not in body["error"]["message"].split("prompt and")[-1], body
    code, body = post({"model": "tiny", "messages": HI, "max_tokens": 3, "stream": None})
    assert code == 200 and body["object"] == "chat.completion", body


def test_error_statuses_raise_the_clients_exception_classes(url):
    c = client(url)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=4)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")
    with pytest.raises(openai.APIStatusError) as e:  # 413 has no class of its own in the client
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a" * (2 << 20)}], max_tokens=4)
    assert e.value.status_code == 413
    for body in (b"{not json", b"[1, 2]", b'{"model": "tiny", "messages": "hi"}', b'{"model": "tiny"}'):
        req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        err = json.loads(e.value.read())["error"]
        assert e.value.code == 400 and set(err) == {"message", "type", "param", "code"}
    assert get(url + "/v1/nothing-here")[0] == 404
    assert get(url + "/health")[0] == 200  # and the server is still up


def test_overload_is_a_429_with_retry_after_and_a_disconnect_frees_the_row(narrow):
    c = client(narrow)
    cancelled = 'specexport_requests_total{outcome="cancelled",route="chat"}'
    t0 = time.perf_counter()
    with c.chat.completions.create(model="tiny", messages=HI, max_tokens=LONG, temperature=0, stream=True,
                                   extra_body={"draft": "none"}) as stream:
        next(iter(stream))  # running: it holds the only row
        assert metric(narrow, "specexport_running_requests") == 1
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model="tiny", messages=HI, max_tokens=4)
        assert e.value.response.headers["retry-after"] == "1" and e.value.code == "rate_limit_exceeded"
    # the client went away after one chunk: the row is free long before the LONG tokens could be done
    while metric(narrow, cancelled) < 1:
        assert time.perf_counter() - t0 < 30
        time.sleep(0.01)
    assert metric(narrow, "specexport_running_requests") == 0
    assert metric(narrow, 'specexport_requests_total{outcome="429",route="chat"}') == 1
    # the row serves the next request (greedy: OpenAI's default temperature 1 ends early with EOS ~1% of the time)
    r = c.chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason == "length"
    page = get(narrow + "/metrics")[1]
    for name in ("specexport_time_to_first_token_seconds_bucket", "specexport_inter_token_seconds_bucket",
                 "specexport_tokens_per_step_bucket", "specexport_queued_requests", "specexport_running_requests",
                 "specexport_prompt_tokens_total", "specexport_completion_tokens_total",
                 "specexport_draft_accepted_tokens_total"):
        assert name in page


def test_api_key_loading_and_draining(bundle):
    app = create_app(ServeConfig(bundle=str(bundle), api_key="sekret"))  # no pipeline yet: loading
    svc = app.state.service
    with running(app) as u:
        assert get(u + "/health")[0] == 503 and json.loads(get(u + "/health")[1])["status"] == "loading"
        with pytest.raises(openai.InternalServerError) as e:
            client(u, "sekret").chat.completions.create(model="tiny", messages=HI, max_tokens=4)
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
        pipe = specexport.load(bundle)
        pipe.start_engine()
        svc.ready(pipe)
        assert get(u + "/health")[0] == 200
        for key in ("wrong", "sekret2"):
            with pytest.raises(openai.AuthenticationError) as e:
                client(u, key).chat.completions.create(model="tiny", messages=HI, max_tokens=4)
            assert e.value.code == "invalid_api_key"
        assert get(u + "/v1/models")[0] == 401  # no header at all
        with pytest.raises(openai.AuthenticationError):
            client(u, "wrong").models.list()
        r = client(u, "sekret").chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=0)
        assert r.usage.completion_tokens == 4  # greedy: sampled, 4 of 400 seeds end early with EOS
        svc.drain()
        assert get(u + "/health")[0] == 503
        with pytest.raises(openai.InternalServerError) as e:
            client(u, "sekret").chat.completions.create(model="tiny", messages=HI, max_tokens=4)
        assert e.value.code == "draining"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve_process(bundle, *flags):
    """`specexport serve` as a subprocess on a free port -> (process, base URL) once /health is 200."""
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "specexport.cli", "serve", str(bundle), "--port", str(port),
                             *flags], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.perf_counter()
        while True:
            assert proc.poll() is None and time.perf_counter() - t0 < 60, proc.stdout and proc.stdout.read()
            try:
                if get(url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_finishes_running_requests_then_exits_0(bundle):
    with serve_process(bundle, "--max-batch", "2", "--prefill-budget", "16") as (proc, url):
        assert metric(url, "specexport_prefill_budget") == 16 and metric(url, "specexport_max_batch") == 2  # the flags
        c = client(url)
        stream = c.chat.completions.create(model="tiny", messages=HI, max_tokens=LONG, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"draft": "none"})
        it = iter(stream)
        chunks = [next(it)]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(openai.APIConnectionError):  # no longer accepting
            c.with_options(timeout=5).chat.completions.create(model="tiny", messages=HI, max_tokens=4)
        chunks += list(it)  # the running request finishes
        assert chunks[-1].usage.completion_tokens == LONG
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
        assert proc.wait(timeout=30) == 0


def test_a_drain_that_runs_out_of_time_answers_503(bundle):
    """--drain-timeout shorter than the running requests: at its end the engine cancels them and their
    handlers, still alive, answer as serving.md says: a stream ends with an error event (the openai client
    raises APIError) and [DONE], a request not streamed gets a 503 in OpenAI's error shape; exit status 0.
    Ctrl-C (SIGINT) drains the same way."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        with serve_process(bundle, "--max-batch", "2", "--drain-timeout", "0.2") as (proc, url):
            c = client(url)
            it = iter(c.chat.completions.create(model="tiny", messages=HI, max_tokens=980, temperature=0,
                                                stream=True, extra_body={"draft": "none"}))
            next(it)
            req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                         headers={"Content-Type": "application/json"},
                                         data=json.dumps({"model": "tiny", "messages": HI, "max_tokens": 980,
                                                          "temperature": 0, "draft": "none"}).encode())
            answer = {}

            def post():
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        answer["status"] = r.status
                except urllib.error.HTTPError as e:
                    answer["status"], answer["body"] = e.code, json.loads(e.read())
            poster = threading.Thread(target=post)
            poster.start()
            t0 = time.perf_counter()
            while json.loads(get(url + "/health")[1])["engine"]["running"] < 2:  # both in the engine
                assert time.perf_counter() - t0 < 10, get(url + "/health")
                time.sleep(0.01)
            proc.send_signal(sig)
            with pytest.raises(openai.APIError, match="shutting down"):
                list(it)
            poster.join(30)
            assert answer["status"] == 503 and answer["body"]["error"]["code"] == "cancelled", answer
            assert proc.wait(timeout=30) == 0


def test_bad_server_settings_are_refused_by_name(bundle):
    for bad, name in (({"max_queue": -1}, "max_queue"), ({"prefill_budget": 0}, "prefill_budget"),
                      ({"max_batch": 0}, "max_batch")):
        with pytest.raises(ValueError, match=name):
            ServeConfig(bundle=str(bundle), **bad)
