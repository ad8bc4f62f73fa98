"""The request engine: many requests on one loaded Pipeline, each a stream of text pieces.

`Pipeline.submit(prompt, ...)` -> Completion: validated before anything is queued (bad options and prompts
that cannot fit raise at submit), queued up to a bound (QueueFull past it), then run. A Completion is
iterated for text pieces from any thread, cancelled from any thread, and carries its Generation
(text, token ids, finish_reason, stats) as it goes.

finish_reason: "eos" | "stop" (a stop string) | "length" | "cancelled" | "error" (then .error holds it).
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

from ..errors import EngineClosed, QueueFull

_DONE = object()


class Completion:
    """One submitted request. Iterate for text pieces (blocks until each is ready); `generation` fills as it
    goes; `cancel()` ends it at the next step and frees its place."""

    def __init__(self, generation):
        self.generation = generation
        self.error: BaseException | None = None
        self._pieces: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self._done = threading.Event()

    # ---- consumer side
    def __iter__(self) -> Iterator[str]:
        while True:
            piece = self._pieces.get()
            if piece is _DONE:
                return
            yield piece

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None):
        """Block until finished -> its Generation (finish_reason set); TimeoutError if it is not done in time."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the request did not finish within {timeout} s")
        return self.generation

    # ---- engine side
    def _put(self, piece: str) -> None:
        self._pieces.put(piece)

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        if self._done.is_set():
            return
        self.generation.finish_reason = reason
        self.error = error
        self._done.set()
        self._pieces.put(_DONE)


class Engine:
    """Runs submitted requests, at most `max_batch` at once, at most `max_queue` more waiting.

    `run(completion)` is the pipeline's function that generates one request to the end, putting its pieces;
    this engine runs each request in a worker thread (every request its own onnxruntime calls)."""

    def __init__(self, run: Callable[[Completion], None], max_batch: int = 4, max_queue: int = 64):
        if not (isinstance(max_batch, int) and max_batch >= 1):
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not (isinstance(max_queue, int) and max_queue >= 0):
            raise ValueError(f"max_queue must be an integer >= 0, got {max_queue!r}")
        self.max_batch, self.max_queue = max_batch, max_queue
        self._run = run
        self._lock = threading.Lock()
        self._waiting: list = []
        self._running: set = set()
        self._closed = False
        self.finished = {}  # finish_reason -> count

    def submit(self, c: Completion) -> Completion:
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is shutting down and takes no new requests")
            if len(self._running) >= self.max_batch and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._running)} requests running and {len(self._waiting)} waiting "
                                f"(max_queue={self.max_queue}): try again later")
            self._waiting.append(c)
            self._admit()
        return c

    def _admit(self) -> None:  # under the lock
        while self._waiting and len(self._running) < self.max_batch:
            c = self._waiting.pop(0)
            self._running.add(c)
            threading.Thread(target=self._work, args=(c,), daemon=True).start()

    def _work(self, c: Completion) -> None:
        try:
            if not c.cancelled:
                self._run(c)
            c._finish("cancelled" if c.cancelled and c.generation.finish_reason == "" else
                      c.generation.finish_reason or "length")
        except BaseException as e:  # noqa: BLE001 -- one failed request ends alone
            c._finish("error", e)
        finally:
            with self._lock:
                self._running.discard(c)
                r = c.generation.finish_reason
                self.finished[r] = self.finished.get(r, 0) + 1
                self._admit()

    def stats(self) -> dict:
        with self._lock:
            return {"running": len(self._running), "queued": len(self._waiting), "max_batch": self.max_batch,
                    "max_queue": self.max_queue, "finished": dict(self.finished)}

    def close(self, timeout: float | None = None) -> bool:
        """Stop taking requests, cancel the waiting ones, let the running ones finish (up to `timeout` s,
        then cancel them) -> True if everything ended in time."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            running = list(self._running)
        for c in waiting:
            c.cancel()
            c._finish("cancelled")
        ok = all(c._done.wait(timeout) for c in running)
        if not ok:
            for c in running:
                c.cancel()
        return ok
