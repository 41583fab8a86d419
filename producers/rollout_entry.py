"""``asyncrl rollout`` as a process: one rollout worker with its signals and exit code.

SIGTERM (``docker stop``, Ray, ``kill``) and a first Ctrl-C make the worker leave its run,
handing its unfinished prompts back to the group; a second Ctrl-C stops it at once. A worker
stopped with its run still open exits 143 (SIGTERM) or 130 (Ctrl-C), never 0, which says the
run finished: ``asyncrl run`` takes it as removed and does not restart it. A worker another
took the place of (its id started twice) exits 1.
"""

from __future__ import annotations

import logging
import signal
import sys

from asyncrl.config import RunConfig
from asyncrl.consumers.exit_codes import ExitCode, stopped_by

log = logging.getLogger("asyncrl.rollout")


def rollout(cfg: RunConfig, worker_id: int, bootstrap: str) -> ExitCode:
    """Run worker ``worker_id`` of ``cfg``'s run on ``bootstrap`` until its run ends or a
    signal stops it; the process's exit code."""
    import torch

    from asyncrl.producers.worker import RolloutWorker

    torch.set_num_threads(cfg.actor_rollout_ref.rollout.torch_threads)
    worker = RolloutWorker(cfg, worker_id, bootstrap)
    told: list[str] = []

    def stop(how: str) -> None:
        told.append(how)
        worker.stop()

    signal.signal(signal.SIGTERM, lambda *_: stop("SIGTERM"))

    def interrupted(*_: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop("Ctrl-C")

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # kept so: `asyncrl run &`
        signal.signal(signal.SIGINT, interrupted)
    produced = worker.run()
    if worker.displaced:
        print(f"asyncrl rollout: worker {worker_id}: {worker.displaced}", file=sys.stderr)
        return ExitCode.FAILED
    if told and not worker.follower.finished:
        log.warning(
            "worker %d stopped (%s) with the run still open; its unfinished prompts went back "
            "to the group",
            worker_id,
            told[0],
        )
        return stopped_by(told[0])
    before = worker.produced_before
    log.info(
        "worker %d produced %d samples%s",
        *(worker_id, produced - before),
        f" ({produced} under its id, with the {before} of earlier processes)" if before else "",
    )
    return ExitCode.OK
