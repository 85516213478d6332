"""A worker runner for the scheduler's tests (scheduler.WorkerRunner): each stage answered without a process, by a
payload or a function of (request, launch), every request kept. Pass it as `worker_runner=` to verify_batch,
measure_references or BatchRun."""

from __future__ import annotations

import threading
from typing import Any, Callable

from dice_pipeline.verify.sandbox import SandboxResult

# A worker that exited cleanly after a second, isolated from the network.
OUTCOME = SandboxResult(0, False, False, 1.0, 10.0, "", True)

Answer = dict | None | Callable[[dict, Any], Any]


class FakeWorkers:
    """Stages answered by `stages` (stage name -> a payload, None for a worker that left no result, or a function
    of (request, launch) returning either or an (outcome, payload) pair); builds succeed and group builds group
    nothing unless told otherwise."""

    def __init__(self, **stages: Answer):
        self.stages: dict[str, Answer] = {"build": {"status": "ok"}, "pch": {"status": "ok"},
                                          "group_build": {"status": "ok", "grouped": [], "attempts": []}, **stages}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, Any], launch: Any) -> tuple[SandboxResult, dict[str, Any] | None]:
        with self._lock:
            self.requests.append(request)
        answer = self.stages[request["stage"]]
        payload = answer(request, launch) if callable(answer) else answer
        if isinstance(payload, tuple):
            return payload
        return OUTCOME, (dict(payload) if payload is not None else None)

    def stage(self, name: str) -> list[dict[str, Any]]:
        """The requests of one stage, in order."""
        return [request for request in self.requests if request["stage"] == name]


def correct(gpu: str = "Fake GPU", **fields: Any) -> dict[str, Any]:
    """A run stage's payload for a correct candidate."""
    return {"status": "correct", "reasons": [], "flags": [], "provenance": {"gpu": gpu}, **fields}
