"""`specexport serve`: an OpenAI-compatible HTTP server on the engine, and its scale-out on Ray Serve.

Modules: schemas.py (the OpenAI wire format), metrics.py (Prometheus), app.py (the FastAPI app and the
server's state), server.py (uvicorn, loading, SIGTERM drain), ray_app.py (Ray Serve deployment). Needs the
`serve` extra (fastapi, uvicorn, pydantic, prometheus-client), Ray the `ray` extra; the runtime never
imports this package.
"""
from .app import ServeConfig, create_app, load_pipeline

__all__ = ["ServeConfig", "create_app", "load_pipeline"]
