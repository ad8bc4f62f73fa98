"""Scale-out on Ray Serve: N replicas of the same OpenAI app, each loading the bundle once; Ray's proxy
routes requests among them (to the replica with fewer requests in flight of two picked at random).

Three ways in:
- `specexport serve BUNDLE --ray --replicas N`: `run(cfg, replicas)` starts (or joins, with RAY_ADDRESS) a
  Ray cluster, deploys, and serves the same routes on cfg.host:cfg.port until SIGTERM / Ctrl-C.
- `serve run specexport.serve.ray_app:app_builder bundle=PATH replicas=N` (Ray's own CLI, or a config file
  for `serve deploy`): `app_builder(args)` -> the Application.
- from Python: `serve.run(deployment(cfg, replicas))`.
Each replica is the app of app.py around its own Pipeline; /metrics answers for the replica that got the
scrape (Ray's own metrics endpoint aggregates ray_serve_*). Imports ray: only loaded for --ray.
"""
from __future__ import annotations

import signal
import threading
from dataclasses import replace

from ray import serve

from .. import bundle
from .app import ServeConfig, create_app, load_pipeline


@serve.deployment
@serve.ingress()
class SpecExportReplica:
    """One replica: the bundle is loaded in the constructor, so Ray routes to it only once it is ready."""

    def __init__(self, cfg: ServeConfig):
        self.cfg = cfg
        self.pipe = load_pipeline(cfg)

    def __serve_build_asgi_app__(self):  # Ray calls it after __init__, on the replica
        return create_app(self.cfg, pipe=self.pipe)


def deployment(cfg: ServeConfig, replicas: int = 1):
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    if cfg.threads is None:  # replicas share the machine's cores: one onnxruntime thread each unless told
        cfg = replace(cfg, threads=1)
    # a replica takes as many requests as its engine holds (rows + queue; rows default to the bundle's largest
    # batch, as the engine's); past that Ray queues them in the proxy rather than one replica answering 429
    # while another has room
    rows = cfg.max_batch or bundle.read(cfg.bundle, verify=False).batch_sizes[-1]
    return SpecExportReplica.options(
        num_replicas=replicas, max_ongoing_requests=rows + cfg.max_queue,
        ray_actor_options={"num_cpus": cfg.threads},
        graceful_shutdown_timeout_s=cfg.drain_timeout).bind(cfg)


def app_builder(args: dict):
    """For `serve run specexport.serve.ray_app:app_builder bundle=PATH [replicas=N max_batch=N max_queue=N
    prefill_budget=N prefix_cache_mb=MB threads=N drain_timeout=S api_key=KEY model_name=NAME]`."""
    ints = {"replicas", "max_batch", "max_queue", "prefill_budget", "threads", "port"}
    a = {k: int(v) if k in ints else float(v) if k in ("drain_timeout", "prefix_cache_mb") else v
         for k, v in args.items()}
    replicas = a.pop("replicas", 1)
    return deployment(ServeConfig(**a), replicas)


def run(cfg: ServeConfig, replicas: int, address: str | None = None) -> int:
    """Deploy `replicas` replicas and serve on cfg.host:cfg.port until SIGTERM / SIGINT -> 0."""
    import ray

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": cfg.host, "port": cfg.port})
        serve.run(deployment(cfg, replicas), name="specexport", route_prefix="/")
        print(f"specexport serve: '{cfg.name}' ready on http://{cfg.host}:{cfg.port}/v1 ({replicas} Ray replicas)",
              flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: stop.set())
        stop.wait()
        # replicas drain for up to graceful_shutdown_timeout_s; other apps of a shared cluster are left alone
        serve.delete("specexport")
    finally:
        ray.shutdown()
    return 0
