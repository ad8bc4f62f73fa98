"""`specexport serve` on one machine: uvicorn in front of the app, the bundle loaded in a thread, SIGTERM drained.

The port opens at once and answers 503 until the bundle is loaded (/health says "loading"). SIGTERM (or
Ctrl-C) marks the service draining (new requests and /health: 503), uvicorn stops accepting connections and
lets the engine's requests run up to `drain_timeout`, then cancels what is left (its handlers answer 503, or
end their streams with an error event and [DONE]), and the process exits 0. A bundle that fails to load ends
the server with exit status 1. The app itself lives in app.py.
"""
from __future__ import annotations

import signal
import sys
import threading
import time

from .app import ServeConfig, create_app, load_pipeline

HANDLER_GRACE_S = 5.0  # past the drain timeout: for handlers to answer the requests the drain cancelled


def serve(cfg: ServeConfig, sockets=None) -> int:
    """Run until SIGTERM / SIGINT -> exit status (0 after a drain, 1 if the bundle failed to load)."""
    import uvicorn

    app = create_app(cfg)
    svc = app.state.service

    def drain():
        """Let the engine's requests (running and queued) finish for up to drain_timeout, then cancel the
        rest: their handlers, still alive, answer 503 or end their streams with an error event and [DONE]."""
        end = time.monotonic() + cfg.drain_timeout
        while time.monotonic() < end and svc.busy():
            time.sleep(0.05)
        svc.close(0.0)  # cancels what is still running (it already had its drain_timeout)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            if svc.status == "ready":  # the first signal only: a second one is uvicorn's force-quit
                svc.drain()  # before uvicorn's own shutdown: requests still arriving get 503, /health says so
                threading.Thread(target=drain, name="specexport-drain", daemon=True).start()
            super().handle_exit(sig, frame)

    # uvicorn cancels the handlers still open after its graceful timeout; ours ends the engine's requests at
    # drain_timeout, so uvicorn gets a few seconds more for the handlers to write their 503s and [DONE]s
    server = Server(uvicorn.Config(app, host=cfg.host, port=cfg.port,
                                   timeout_graceful_shutdown=cfg.drain_timeout + HANDLER_GRACE_S,
                                   log_level="info", access_log=False, lifespan="on"))
    status = 0

    def load():
        nonlocal status
        try:
            svc.ready(load_pipeline(cfg))
            print(f"specexport serve: '{cfg.name}' ready on http://{cfg.host}:{cfg.port}/v1", flush=True)
        except BaseException as e:  # noqa: BLE001 -- reported, then the server stops with status 1
            svc.failed(e)
            print(f"specexport serve: error: the bundle failed to load: {e}", file=sys.stderr, flush=True)
            status = 1
            server.should_exit = True

    threading.Thread(target=load, name="specexport-load", daemon=True).start()
    # uvicorn restores the handler it found and re-raises a caught signal into it once it has shut down;
    # a no-op handler there turns a drained SIGTERM into a normal exit 0 instead of death by signal
    # (SIGINT too: Ctrl-C drains like SIGTERM and exits 0)
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = [signal.signal(g, lambda sig, frame: None) for g in signals] if _main_thread() else None
    try:
        server.run(sockets=sockets)
    finally:
        if previous is not None:
            for g, h in zip(signals, previous):
                signal.signal(g, h)
    return status


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
