"""Start-up checks of a sharded trainer: ``trainer.nnodes x trainer.n_gpus_per_node`` ranks
that can run, refused otherwise naming the key (docs/design.md, "The trainer's update backend,
and a sharded trainer"). One rank (the default) is checked by nothing here."""

from __future__ import annotations

from asyncrl.config import RunConfig
from asyncrl.launch.preflight_check import Check


def rank_checks(cfg: RunConfig, role: str, here: bool) -> list[Check]:
    """The checks of the trainer's ranks for ``role`` (run or train); ``here``: this process
    starts them, on this machine."""
    tc, actor = cfg.trainer, cfg.actor_rollout_ref.actor
    ranks = tc.ranks
    if ranks == 1:
        return []
    key = "trainer.n_gpus_per_node"
    checks: list[Check] = []
    if role == "run" and tc.nnodes > 1 and cfg.launcher == "local":
        checks.append(
            Check(
                "trainer.nnodes",
                False,
                f"{tc.nnodes}: asyncrl run starts the trainer's ranks on its own machine; "
                "launcher=ray places them on the cluster's nodes (a bundle each), or start "
                "them there by hand (torchrun --nnodes "
                f"{tc.nnodes} --nproc-per-node {tc.n_gpus_per_node} -m asyncrl train ...)",
            )
        )
    if cfg.actor_rollout_ref.rollout.name == "sim":
        checks.append(
            Check(key, False, f"{tc.n_gpus_per_node}: rollout.name=sim models one trainer process")
        )
    if actor.ppo_mini_batch_size % ranks:
        checks.append(
            Check(
                "actor_rollout_ref.actor.ppo_mini_batch_size",
                False,
                f"{actor.ppo_mini_batch_size} samples do not split evenly over {ranks} trainer "
                "ranks (trainer.nnodes x trainer.n_gpus_per_node)",
            )
        )
    if actor.use_dynamic_bsz:
        checks.append(
            Check(
                "actor_rollout_ref.actor.use_dynamic_bsz",
                False,
                f"not with {ranks} trainer ranks: their micro-batch counts must agree",
            )
        )
    checks.append(_devices(cfg, here))
    return checks


def _devices(cfg: RunConfig, here: bool) -> Check:
    """One GPU per rank on CUDA; processes on the CPU."""
    tc = cfg.trainer
    key, per_node = "trainer.n_gpus_per_node", tc.n_gpus_per_node
    layout = f"{tc.ranks} trainer ranks ({tc.nnodes} x {per_node})"
    if tc.device == "cpu":
        return Check(key, True, f"{layout}, processes on the CPU (gloo)")
    if not here:
        return Check(key, None, f"{layout}: the GPUs are checked by each rank (launcher=ray)")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if tc.device == "auto" and gpus == 0:
        return Check(key, True, f"{layout}, processes on the CPU (gloo): no GPU here")
    if per_node > gpus:
        return Check(
            key,
            False,
            f"{per_node} ranks on this machine need a GPU each (NCCL), and it has {gpus}; "
            "trainer.device=cpu runs them on the CPU (gloo)",
        )
    return Check(key, True, f"{layout}, one GPU each (NCCL)")
