"""A trainer rank other than 0: it holds its shards of the policy and follows rank 0.

It reads no topic and publishes nothing; rank 0 is the trainer (``consumers/rank_zero.py``).
It waits for rank 0's commands (``consumers/ranks.py``) and meets each in its collectives:

* ``step``: receive the step's samples (``broadcast_samples``), take the FSDP2 step on its
  share of each mini-batch, join the gather of the new weights into rank 0's copy;
* ``snapshot`` / ``load``: join the checkpoint's gather or broadcast
  (``consumers/rank_checkpoint.py``);
* ``stop``: the trainer has ended; exit 0.

SIGTERM and Ctrl-C do not stop it: rank 0 takes them too and stops the group between two
steps, after the checkpoint this rank joins. It exits when rank 0's store closes (rank 0 died:
the launcher restarts the whole group) and dies with a collective that fails or times out.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.consumers.exit_codes import ExitCode
from asyncrl.consumers.ranks import RankGroup

log = logging.getLogger("asyncrl.train")


def follow_rank_zero(cfg: RunConfig, group: RankGroup, policy: Any = None) -> ExitCode:
    """Follow rank 0's commands until it says stop; the process's exit code."""
    from asyncrl.consumers.fsdp_update import FsdpUpdate, broadcast_samples
    from asyncrl.consumers.rank_checkpoint import gather_snapshot, load_broadcast

    def stopped_by_rank_zero(signum: int, _frame: object) -> None:
        log.info("%s: rank 0 stops the group", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stopped_by_rank_zero)
    signal.signal(signal.SIGINT, stopped_by_rank_zero)
    fsdp = FsdpUpdate(cfg, policy=policy)
    log.info("trainer %s: following rank 0", group.env.name)
    while True:
        command = group.receive()
        op = command["op"]
        if op == "step":
            t0 = time.monotonic()
            samples = broadcast_samples(None)
            fsdp.step(samples, command["step"], command["version"])
            fsdp.full_state_dict()  # into rank 0's copy
            log.info(
                "step %d, version %d: its %d of %d samples trained in %.2f s",
                *(command["step"], command["version"], len(fsdp.share(samples)), len(samples)),
                time.monotonic() - t0,
            )
        elif op == "snapshot":
            gather_snapshot(fsdp, None, None)
        elif op == "load":
            load_broadcast(fsdp, None, None)
            log.info("loaded the checkpoint rank 0 resumes from (%s)", command.get("path"))
        elif op == "stop":
            log.info("rank 0 has stopped: exiting")
            group.stopped()
            return ExitCode.OK
        else:
            raise RuntimeError(f"unknown command from rank 0: {command}")
