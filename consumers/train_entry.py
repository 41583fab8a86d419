"""``asyncrl train`` as a process: the trainer with its signals, its summary and exit code.

SIGTERM (``docker compose stop``, ``kill``, the launcher) and a first Ctrl-C stop the trainer
between two steps, with a checkpoint of the last one; a second Ctrl-C stops it at once. A
stopped trainer exits 143 (SIGTERM) or 130 (Ctrl-C), leaving its run open; a finished one
writes ``summary.json`` (whole or absent: a relaunch reads it) and exits 0.
"""

from __future__ import annotations

import json
import logging
import signal

from asyncrl.config import RunConfig
from asyncrl.consumers.backend import UpdateBackend
from asyncrl.consumers.exit_codes import ExitCode, stopped_by

log = logging.getLogger("asyncrl.train")


def train(cfg: RunConfig, bootstrap: str, backend: UpdateBackend | None = None) -> ExitCode:
    """Run the trainer of ``cfg``'s run on ``bootstrap`` until its run ends or a signal stops
    it; the process's exit code. ``backend`` replaces the update (None: the config's)."""
    import torch

    from asyncrl.consumers.trainer import Trainer, TrainerStopped

    torch.set_num_threads(cfg.trainer.torch_threads)
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
