"""Prometheus metrics of one server: what `GET /metrics` answers.

Each server has its own CollectorRegistry (several apps can live in one process: tests, Ray replicas on
one node). Counters and histograms are updated by the routes when a request ends; the engine's gauges
(running rows, queue depth, steps by batch size) are read from `engine.stats()` at scrape time, so they
are never stale. Ratios are left to PromQL, e.g. tokens per target step = rate(completion_tokens) / rate(target_steps),
acceptance = rate(draft_accepted_tokens) / rate(draft_proposed_tokens).
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series: they double the page and nobody graphs them
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PER_TOKEN = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1)


class _EngineGauges:
    """Reads the engine's stats() at each scrape. Keys read with .get: an engine may lack some of them."""

    def __init__(self, stats: Callable[[], dict | None]):
        self._stats = stats

    def collect(self):
        s = self._stats() or {}
        for name, key, doc in (("running_requests", "running", "requests holding a batch row"),
                               ("decoding_requests", "decoding", "running requests past their prefill"),
                               ("queued_requests", "queued", "requests waiting for a batch row"),
                               ("max_batch", "max_batch", "configured batch rows"),
                               ("max_queue", "max_queue", "configured queue bound"),
                               ("prefill_budget", "prefill_budget",
                                "prompt tokens prefilled per step while others decode")):
            value = s.get(key, s.get("running", 0) if key == "decoding" else 0)
            yield GaugeMetricFamily(f"specexport_{name}", doc, value=float(value or 0))
        for name, key, doc in (("engine_steps", "steps", "target calls of the engine (all rows at once)"),
                               ("engine_tokens", "tokens", "tokens the engine emitted, all rows")):
            if isinstance(s.get(key), (int, float)):
                yield CounterMetricFamily(f"specexport_{name}", doc, value=float(s[key]))
        pc = s.get("prefix_cache")
        if isinstance(pc, dict):
            yield CounterMetricFamily("specexport_prefix_cache_hit_tokens", "prompt tokens taken from the prefix "
                                      "cache instead of prefilled", value=float(pc.get("hit_tokens", 0)))
            yield GaugeMetricFamily("specexport_prefix_cache_bytes", "bytes of K/V the prefix cache holds",
                                    value=float(pc.get("bytes", 0)))
        if isinstance(s.get("batch"), dict):  # {B: engine steps that ran B rows}: the batch-size distribution
            c = CounterMetricFamily("specexport_engine_steps_by_batch", "engine steps by batch rows B",
                                    labels=["batch"])
            for b, n in sorted(s["batch"].items()):
                c.add_metric([str(b)], float(n))
            yield c


class Metrics:
    def __init__(self, engine_stats: Callable[[], dict | None]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specexport_requests", "requests by route and outcome: stop | length | "
                                "cancelled | error, or the HTTP status of a refusal", ["route", "outcome"], registry=r)
        self.prompt_tokens = Counter("specexport_prompt_tokens", "prompt tokens of served requests", registry=r)
        self.completion_tokens = Counter("specexport_completion_tokens", "generated tokens (usage)", registry=r)
        self.target_steps = Counter("specexport_target_steps", "target calls after the prefill", registry=r)
        self.proposed = Counter("specexport_draft_proposed_tokens", "drafted tokens sent to verification",
                                registry=r)
        self.accepted = Counter("specexport_draft_accepted_tokens", "drafted tokens the target accepted", registry=r)
        self.tokens_per_step = Histogram("specexport_tokens_per_step", "per request: tokens per target step",
                                         buckets=(1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8), registry=r)
        self.ttft = Histogram("specexport_time_to_first_token_seconds", "request received -> first text piece",
                              buckets=_LATENCY, registry=r)
        self.itl = Histogram("specexport_inter_token_seconds", "per request: mean time between tokens after the "
                             "first", buckets=_PER_TOKEN, registry=r)
        self.latency = Histogram("specexport_request_duration_seconds", "request received -> last byte",
                                 buckets=_LATENCY, registry=r)
        r.register(_EngineGauges(engine_stats))

    def refused(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def finished(self, route: str, outcome: str, prompt_tokens: int, completion_tokens: int, stats,
                 ttft: float | None, total: float) -> None:
        self.requests.labels(route, outcome).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.target_steps.inc(stats.steps)
        self.proposed.inc(stats.proposed)
        self.accepted.inc(stats.accepted)
        if stats.steps:
            self.tokens_per_step.observe(stats.new_tokens / stats.steps)
        if ttft is not None:
            self.ttft.observe(ttft)
            if completion_tokens > 1:
                self.itl.observe((total - ttft) / (completion_tokens - 1))
        self.latency.observe(total)

    def render(self) -> bytes:
        return generate_latest(self.registry)
