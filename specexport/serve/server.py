"""`specexport serve` on one machine: uvicorn in front of the app, the bundle loaded in a thread, SIGTERM drained.

The port opens at once and answers 503 until the bundle is loaded (/health says "loading"). SIGTERM (or
Ctrl-C) marks the service draining (new requests and /health: 503), uvicorn stops accepting connections and
waits up to `drain_timeout` for the open ones, the lifespan hook cancels what is left, and the process exits
0. A bundle that fails to load ends the server with exit status 1. The app itself lives in app.py.
"""
from __future__ import annotations

import signal
import sys
import threading

from .app import ServeConfig, create_app, load_pipeline


def serve(cfg: ServeConfig, sockets=None) -> int:
    """Run until SIGTERM / SIGINT -> exit status (0 after a drain, 1 if the bundle failed to load)."""
    import uvicorn

    app = create_app(cfg)
    svc = app.state.service

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            svc.drain()  # before uvicorn's own shutdown: requests still arriving get 503, /health says so
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, timeout_graceful_shutdown=cfg.drain_timeout,
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
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: None) if _main_thread() else None
    try:
        server.run(sockets=sockets)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return status


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
