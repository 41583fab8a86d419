"""A stepwise engine on a thread of its own: the request-level contract, served the way a
vLLM or SGLang server serves it.

Why: the rollout worker should react to control events (a sync, a new trainer, a moved
partition) while the engine decodes, not between two decoding steps it drives itself. Here
the engine's thread decodes whenever a request is active; the worker submits requests and
collects finished results (``collect`` waits for one up to a timeout). Whatever changes the
engine's state from outside (``abort``, ``update_weights``) is handed to the engine's thread
and runs there between two decoding steps, while the caller waits: an abort returns each
request's tokens so far, as vLLM's ``abort`` and SGLang's ``abort_request`` do, and a weight
update never meets a half-done forward pass.

A result that finished but was not collected yet belongs to the engine until ``collect``
takes it: ``abort`` returns it (with its own finish reason), so a caller that aborts a
request never also collects it. An exception on the engine's thread is raised by the next
``add`` or ``collect``; ``abort`` still returns what each request had.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from asyncrl.producers.engines.base import GenRequest, GenResult, StepwiseEngine, generate_all

T = TypeVar("T")


class BackgroundEngine:
    def __init__(self, engine: StepwiseEngine) -> None:
        self.engine = engine
        self.model = engine.model
        self._cv = threading.Condition()
        self._submitted: list[GenRequest] = []
        self._calls: list[tuple[Callable[[], Any], Future[Any]]] = []
        self._finished: dict[str, GenResult] = {}
        """Results not collected yet, in the order they finished."""
        self._running = 0
        """Requests in the stepwise engine (known only on its thread; read under the lock)."""
        self._closed = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="engine", daemon=True)
        self._thread.start()

    # --- the caller's side ----------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        """Requests submitted whose results have not been collected (or aborted) yet."""
        with self._cv:
            return len(self._submitted) + self._running + len(self._finished)

    @property
    def full_batch(self) -> int | None:
        return self.engine.full_batch

    def add(self, req: GenRequest) -> None:
        with self._cv:
            self._check()
            self._submitted.append(req)
            self._cv.notify_all()

    def collect(
        self, timeout: float = 0.0, request_ids: Container[str] | None = None
    ) -> list[GenResult]:
        """Results finished since the last call; waits up to ``timeout`` for the first.
        ``request_ids``: only those; the others stay for a later call (a held-out evaluation
        sharing the engine with the worker's rollout takes its own results alone)."""

        def ready() -> list[str]:
            return [rid for rid in self._finished if request_ids is None or rid in request_ids]

        with self._cv:
            self._check()
            if timeout > 0 and not ready():
                self._cv.wait_for(lambda: ready() or self.error, timeout)
                self._check()
            return [self._finished.pop(rid) for rid in ready()]

    def abort(self, request_ids: Iterable[str] | None = None) -> list[GenResult]:
        """Stop the named requests (default: all) between two decoding steps; each one's
        tokens so far (finish reason "abort"), or its uncollected result. Unknown ids are
        ignored."""
        wanted = None if request_ids is None else set(request_ids)

        def abort() -> list[GenResult]:
            def hit(rid: str) -> bool:
                return wanted is None or rid in wanted

            for req in [r for r in self._submitted if hit(r.request_id)]:
                self._submitted.remove(req)
                self.engine.add(req)  # never started: its result is its prefix
            out = [self._finished.pop(rid) for rid in list(self._finished) if hit(rid)]
            running = [rid for rid in self.engine.active_ids() if hit(rid)]
            out += self.engine.abort(running)
            self._running = self.engine.num_active
            return out

        return self._on_engine_thread(abort)

    def update_weights(self, apply: Callable[[torch.nn.Module], T]) -> T:
        """Run ``apply(model)`` (a receive into it, a copy from a second buffer) between two
        decoding steps; what it returns or raises, the caller gets."""
        return self._on_engine_thread(lambda: self.engine.update_weights(apply))

    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        return generate_all(self, reqs)

    def prepare(self, rows: int, length: int) -> None:
        """On the engine's thread, where its steps run (CUDA graphs are captured there)."""
        self._on_engine_thread(lambda: self.engine.prepare(rows, length))

    def close(self) -> None:
        """Stop the thread after its current step; requests still active are dropped."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=10)
        self.engine.close()

    def _check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the engine's thread failed: {self.error!r}") from self.error
        if self._closed:
            raise RuntimeError("the engine is closed")

    def _on_engine_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine's thread between two steps, and wait for it. Once that
        thread has ended (closed, or failed), nothing races it: ``fn`` runs here."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            with self._cv:
                return fn()
        future: Future[T] = Future()
        with self._cv:
            self._check()
            self._calls.append((fn, future))
            self._cv.notify_all()
        return future.result()

    # --- the engine's thread --------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(
                        lambda: self._closed or self._calls or self._submitted or self._running
                    )
                    if self._closed:
                        break
                    calls, self._calls = self._calls, []
                    for fn, future in calls:  # between two steps, under the lock
                        try:
                            future.set_result(fn())
                        except BaseException as err:  # the caller raises it
                            future.set_exception(err)
                    submitted, self._submitted = self._submitted, []
                    for req in submitted:
                        self.engine.add(req)
                    self._running = self.engine.num_active
                    if not self._running:
                        continue
                finished = self.engine.step()  # outside the lock: callers may add meanwhile
                with self._cv:
                    for res in finished:
                        self._finished[res.request_id] = res
                    self._running = self.engine.num_active
                    if finished:
                        self._cv.notify_all()
        except BaseException as err:
            with self._cv:
                self.error = err
                self._cv.notify_all()
        finally:
            with self._cv:
                for _fn, future in self._calls:
                    future.set_exception(RuntimeError("the engine's thread has stopped"))
                self._calls = []
