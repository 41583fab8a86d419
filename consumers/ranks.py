"""The trainer's ranks: which rank this process is, the group joined, and rank 0's commands.

With ``trainer.nnodes x trainer.n_gpus_per_node`` = N > 1, ``asyncrl train`` is one of N
ranks, started as ``torchrun`` starts them: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` in its environment (``asyncrl run`` sets them:
``launch/rank_group.py``). Rank 0 is the trainer (``consumers/rank_zero.py``); the others
follow it (``consumers/rank_follower.py``). N = 1 never comes here.

Rank 0 tells the others what comes next through the group's store (a TCP key-value store
rank 0 hosts, torch's rendezvous): command n under ``asyncrl/cmd/<n>``, a small JSON object.
A follower waits for it for as long as rank 0 spends between two commands (waiting for
samples, a weight sync, an evaluation): a wait inside a collective would fail at the
collective timeout while rank 0 waits for samples. The collectives (the
step's samples, FSDP's own, the gathers) follow a command at once, so
``actor_rollout_ref.nccl_timeout`` bounds the wait for a rank that hangs in one. A rank that
dies closes its connections: a collective fails at once (gloo), and a follower whose rank 0
is gone finds the store closed and exits.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from asyncrl.config import ConfigError, RunConfig

log = logging.getLogger(__name__)

RANK_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What a rank reads from its environment (torchrun's names), besides LOCAL_RANK."""

WAIT_SLICE = timedelta(hours=1)
"""A follower waits for rank 0's next command this long at a time, for as long as it takes
(a wait that ends logs a warning of torch's: short slices filled the log)."""
STOP_WAIT = timedelta(seconds=10)
"""How long rank 0, ending, waits for the others to take its stop before its store goes."""


class RankZeroGone(RuntimeError):
    """A follower lost rank 0 (its store closed): the group is over."""


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int

    @property
    def name(self) -> str:
        """As logs, ``ps`` and the launcher name this rank."""
        return f"rank {self.rank}/{self.world}"


def how_to_start(cfg: RunConfig) -> str:
    tc = cfg.trainer
    return (
        "`asyncrl run` starts the ranks; by hand: torchrun "
        f"--nnodes {tc.nnodes} --nproc-per-node {tc.n_gpus_per_node} -m asyncrl train --config ..."
    )


def rank_env(cfg: RunConfig, environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """This process's rank, read from ``environ`` (the process's own by default); None where
    the trainer is one process. A rank count the environment does not start as configured is
    refused, naming the key."""
    environ = os.environ if environ is None else environ
    world = cfg.trainer.ranks
    given = environ.get("WORLD_SIZE")
    if world == 1:
        if given not in (None, "1"):
            raise ConfigError(
                f"trainer.n_gpus_per_node: WORLD_SIZE={given} in this process's environment "
                "(torchrun?), but trainer.nnodes x trainer.n_gpus_per_node = 1: set them to "
                "the ranks you start"
            )
        return None
    missing = [v for v in RANK_VARS if v not in environ]
    if missing:
        raise ConfigError(
            f"trainer.n_gpus_per_node: trainer.nnodes x trainer.n_gpus_per_node = {world} "
            f"trainer ranks, but this process has no {', '.join(missing)} in its environment: "
            + how_to_start(cfg)
        )
    if int(environ["WORLD_SIZE"]) != world:
        raise ConfigError(
            f"trainer.n_gpus_per_node: WORLD_SIZE={environ['WORLD_SIZE']} ranks were started, "
            f"but trainer.nnodes x trainer.n_gpus_per_node = {world}: " + how_to_start(cfg)
        )
    rank = int(environ["RANK"])
    return RankEnv(
        rank=rank,
        world=world,
        local_rank=int(environ.get("LOCAL_RANK", rank % cfg.trainer.n_gpus_per_node)),
        master_addr=environ["MASTER_ADDR"],
        master_port=int(environ["MASTER_PORT"]),
    )


class RankGroup:
    """This rank in the trainer's group: ``torch.distributed`` initialised (gloo on the CPU,
    NCCL on GPUs, one GPU per rank: ``LOCAL_RANK``), every collective timed out after
    ``actor_rollout_ref.nccl_timeout`` seconds, and the command channel over the store."""

    def __init__(self, cfg: RunConfig, env: RankEnv):
        import torch
        import torch.distributed as dist

        from asyncrl.models.policy import resolve_device
        from asyncrl.telemetry.process_title import set_title

        self.env = env
        set_title(f"asyncrl train {env.name} ({cfg.run_id})")
        cuda = resolve_device(cfg.trainer.device).type == "cuda"
        if cuda:
            torch.cuda.set_device(env.local_rank)
        timeout = timedelta(seconds=cfg.actor_rollout_ref.nccl_timeout)
        log.info(
            "trainer %s on %s (pid %d): joining the group at %s:%d (%s, collectives time out "
            "after %d s)",
            *(env.name, socket.gethostname(), os.getpid(), env.master_addr, env.master_port),
            *("nccl" if cuda else "gloo", cfg.actor_rollout_ref.nccl_timeout),
        )
        # torchrun's agent hosts the store itself (env:// finds it); else rank 0 does
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
        url = "env://" if agent else f"tcp://{env.master_addr}:{env.master_port}"
        store, _, _ = next(dist.rendezvous(url, env.rank, env.world, timeout=timeout))
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=store,
            rank=env.rank,
            world_size=env.world,
            timeout=timeout,
        )
        self.store = dist.PrefixStore("asyncrl/cmd", store)
        self._sent = 0
        self._received = 0

    @property
    def rank(self) -> int:
        return self.env.rank

    def send(self, op: str, **args: Any) -> None:
        """Rank 0: tell the others what comes next (they then meet it in its collectives)."""
        self.store.set(str(self._sent), json.dumps({"op": op, **args}))
        self._sent += 1

    def receive(self) -> dict[str, Any]:
        """A follower: rank 0's next command, however long rank 0 takes to send it.
        Raises RankZeroGone when rank 0's store closes."""
        import torch.distributed as dist

        key = str(self._received)
        while True:
            try:
                self.store.wait([key], WAIT_SLICE)
                break
            except dist.DistStoreError:  # an hour passed: rank 0 is between two commands
                continue
            except dist.DistNetworkError as err:
                raise RankZeroGone(f"rank 0's store closed ({err}): rank 0 has stopped") from err
        command: dict[str, Any] = json.loads(self.store.get(key))
        self._received += 1
        return command

    def stop_others(self) -> None:
        """Rank 0, ending: tell the others to exit, and wait (up to ``STOP_WAIT``) until each
        has taken it: the store goes with rank 0, and a rank still reading the command then
        would take the stop for rank 0's death."""
        import torch.distributed as dist

        self.send("stop")
        try:
            self.store.wait([f"stopped/{r}" for r in range(1, self.env.world)], STOP_WAIT)
        except dist.DistError as err:
            log.warning("not every rank took the stop within %s: %s", STOP_WAIT, err)

    def stopped(self) -> None:
        """A follower: rank 0's stop taken."""
        self.store.set(f"stopped/{self.env.rank}", "1")

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
