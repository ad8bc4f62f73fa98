"""`specexport serve --ray --replicas 2`: two Ray Serve replicas on loopback behind one port (slow: a Ray
cluster starts, ~30 s). Skipped, saying so, where ray[serve] is not installed (pip install '.[ray]')."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[ray]' to run this test")
openai = pytest.importorskip("openai", reason="needs the openai client: pip install '.[test]'")

import specexport  # noqa: E402
from test_serve import HI, bundle, client, free_port, get  # noqa: E402,F401 -- bundle: test_serve's fixture

pytestmark = pytest.mark.slow


def test_two_replicas_answer_the_same_routes_and_shut_down_on_sigterm(bundle):  # noqa: F811
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, on this machine
    proc = subprocess.Popen([sys.executable, "-m", "specexport.cli", "serve", str(bundle), "--ray", "--replicas", "2",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        t0 = time.perf_counter()
        # /health answers as soon as one replica is up; the "ready" line comes once serve.run has all of them
        while not any("ready on" in line for line in lines):
            assert proc.poll() is None and time.perf_counter() - t0 < 180, "".join(lines)
            time.sleep(0.5)
        pids = {json.loads(get(url + "/health")[1])["pid"] for _ in range(40)}
        assert len(pids) == 2  # Ray spreads requests over both replicas

        pipe = specexport.load(bundle)
        prompts = [[{"role": "user", "content": f"Question {i}: why?"}] for i in range(8)]
        want = [pipe.generate(p, max_new_tokens=24, draft="none").text for p in prompts]

        def ask(p):
            return client(url).chat.completions.create(model="tiny", messages=p, max_tokens=24, temperature=0)

        with ThreadPoolExecutor(8) as ex:
            got = list(ex.map(ask, prompts))
        assert [r.choices[0].message.content for r in got] == want
        assert all(r.usage.completion_tokens == 24 for r in got)
        with pytest.raises(openai.NotFoundError):  # the OpenAI error shape through Ray's proxy
            client(url).chat.completions.create(model="other", messages=HI, max_tokens=4)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
