"""``asyncrl train`` as a process: the trainer with its signals, its summary and exit code.

SIGTERM (``docker compose stop``, ``kill``, the launcher) and a first Ctrl-C stop the trainer
between two steps, with a checkpoint of the last one; a second Ctrl-C stops it at once. A
stopped trainer exits 143 (SIGTERM) or 130 (Ctrl-C), leaving its run open; a finished one
writes ``summary.json`` (whole or absent: a relaunch reads it) and exits 0.

With ``trainer.nnodes x trainer.n_gpus_per_node`` > 1 this process is one rank of the trainer
(``consumers/ranks.py``): rank 0 runs the trainer as above on the sharded backend
(``consumers/rank_zero.py``) and tells the others to stop when it ends; the others follow it
(``consumers/rank_follower.py``).
"""

from __future__ import annotations

import json
import logging
import signal

from asyncrl.config import RunConfig
from asyncrl.consumers.backend import UpdateBackend
from asyncrl.consumers.exit_codes import ExitCode, stopped_by
from asyncrl.consumers.ranks import RankEnv, RankZeroGone, rank_env

log = logging.getLogger("asyncrl.train")


def train(cfg: RunConfig, bootstrap: str, backend: UpdateBackend | None = None) -> ExitCode:
    """Run the trainer of ``cfg``'s run on ``bootstrap`` until its run ends or a signal stops
    it; the process's exit code. ``backend`` replaces the update (None: the config's)."""
    import torch

    torch.set_num_threads(cfg.trainer.torch_threads)
    env = rank_env(cfg)
    if env is not None:
        return _rank(cfg, bootstrap, env)
    return _trainer(cfg, bootstrap, backend)


def _trainer(cfg: RunConfig, bootstrap: str, backend: UpdateBackend | None) -> ExitCode:
    from asyncrl.consumers.trainer import Trainer, TrainerStopped

    trainer = Trainer(cfg, bootstrap, backend=backend)
    signal.signal(signal.SIGTERM, lambda *_: trainer.stop("SIGTERM"))

    def interrupted(*_: object) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        trainer.stop("Ctrl-C")

    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # kept so: `asyncrl run &`
        signal.signal(signal.SIGINT, interrupted)
    try:
        summary = trainer.run()
    except TrainerStopped as stopped:
        log.warning("%s", stopped)
        return stopped_by(trainer.stopping or "SIGTERM")
    finally:
        trainer.close()
    tmp = cfg.run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(cfg.run_dir / "summary.json")
    log.info(
        "done at step %s, version %s (%s); summary in %s",
        *(summary.get("step"), summary.get("version"), summary.get("reason")),
        cfg.run_dir / "summary.json",
    )
    return ExitCode.OK


def _rank(cfg: RunConfig, bootstrap: str, env: RankEnv) -> ExitCode:
    """This process as rank ``env.rank`` of the trainer's group. A rank 0 that fails raises
    and exits at once: its store closes, the others exit on that, and ``asyncrl run``
    restarts the group."""
    from asyncrl.consumers.rank_follower import follow_rank_zero
    from asyncrl.consumers.rank_zero import RankZeroUpdate
    from asyncrl.consumers.ranks import RankGroup

    group = RankGroup(cfg, env)
    if env.rank > 0:
        try:
            code = follow_rank_zero(cfg, group)
        except RankZeroGone as gone:
            log.error("trainer %s: %s", env.name, gone)
            return ExitCode.FAILED
    else:
        backend = RankZeroUpdate(cfg, group)
        code = _trainer(cfg, bootstrap, backend)  # finished, or stopped by a signal
        backend.stop()
    group.close()
    return code
