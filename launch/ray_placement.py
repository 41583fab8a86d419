"""Where a Ray run's roles go: two placement groups, the trainer's and the rollout workers'.

1. The trainer's group: one bundle per trainer rank (``trainer.nnodes x
   trainer.n_gpus_per_node``; one today without ranks), each ``ray.trainer_num_cpus|gpus``
   plus a thousandth of ``ray.trainer_node_resource`` when set, laid out with
   ``ray.placement_strategy``. Rank r's actor goes into bundle r.
2. The workers' group: one bundle per rollout worker (``rollout.num_workers``), each
   ``ray.rollout_num_cpus|gpus`` plus a thousandth of ``ray.rollout_node_resource``, laid out
   with ``ray.rollout_placement_strategy``. Worker i's actor goes into bundle i.
3. Both groups are reserved before any role starts, within ``ray.placement_timeout_s``; a
   cluster that cannot grant them fails the launch saying what was asked and what it has.
4. The trainer's address (``sync.master_addr``, and MASTER_ADDR for its ranks) is the node
   of bundle 0, known once the group is reserved: the workers find the trainer there.

Two groups, not one: a strategy spans one group, so the trainer packed on its nodes does
not pull the workers onto them. A restarted role goes back into its own bundle, which its dead
actor has freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncrl.config import ConfigError, RunConfig
from asyncrl.launch.preflight_check import Check

NODE_RESOURCE_SHARE = 0.001
"""What one bundle asks of its role's node resource: a node with 1 of it takes 1000 bundles,
so the resource picks nodes and limits nothing."""


def trainer_ranks(cfg: RunConfig) -> int:
    """The trainer's processes: its ranks where the config has them, else one."""
    return int(getattr(cfg.trainer, "ranks", 1))


def rank_of(name: str) -> int | None:
    """The trainer rank a launcher's process name is (``trainer`` is rank 0,
    ``trainer-rank-r`` rank r); None for any other role."""
    if name == "trainer":
        return 0
    if name.startswith("trainer-rank-") and name.removeprefix("trainer-rank-").isdigit():
        return int(name.removeprefix("trainer-rank-"))
    return None


def worker_of(name: str) -> int | None:
    """The rollout worker a launcher's process name is (``rollout-i``); None otherwise."""
    if name.startswith("rollout-") and name.removeprefix("rollout-").isdigit():
        return int(name.removeprefix("rollout-"))
    return None


def bundle(cpus: float, gpus: float, node_resource: str | None) -> dict[str, float]:
    """One actor's reservation: what it runs on, and the mark of its nodes."""
    out = {"CPU": float(cpus), "GPU": float(gpus)}
    if node_resource is not None:
        out[node_resource] = NODE_RESOURCE_SHARE
    return {k: v for k, v in out.items() if v > 0}


def trainer_bundle(cfg: RunConfig) -> dict[str, float]:
    rc = cfg.ray
    return bundle(rc.trainer_num_cpus, rc.trainer_num_gpus, rc.trainer_node_resource)


def rollout_bundle(cfg: RunConfig) -> dict[str, float]:
    rc = cfg.ray
    return bundle(rc.rollout_num_cpus, rc.rollout_num_gpus, rc.rollout_node_resource)


def placement_checks(cfg: RunConfig) -> list[Check]:
    """Start-up checks of ``launcher=ray``'s bundles: Ray places no empty bundle, so a role
    reserving nothing (no CPU, no GPU, no node resource) is refused, naming the key."""
    checks = []
    for role, made, key in (
        ("trainer", trainer_bundle(cfg), "ray.trainer_num_cpus"),
        ("rollout", rollout_bundle(cfg), "ray.rollout_num_cpus"),
    ):
        if made:
            checks.append(Check(key, True, f"each {role} bundle {made}"))
        else:
            checks.append(
                Check(
                    key,
                    False,
                    f"0, with ray.{role}_num_gpus=0 and no ray.{role}_node_resource: a {role} "
                    "bundle would reserve nothing, and Ray places no empty bundle",
                )
            )
    return checks


@dataclass
class Slot:
    """Where one role's actor goes: a placement group and a bundle of it."""

    group: Any
    index: int

    def strategy(self) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.index
        )


class Placement:
    """The run's two placement groups, reserved on the cluster Ray is connected to."""

    def __init__(self, cfg: RunConfig) -> None:
        from ray.util.placement_group import placement_group

        self.cfg = cfg
        rc, workers = cfg.ray, cfg.actor_rollout_ref.rollout.num_workers
        _need_node_resources(cfg)
        name = f"asyncrl-{cfg.run_id}"
        self.trainer = placement_group(
            [trainer_bundle(cfg)] * trainer_ranks(cfg),
            strategy=rc.placement_strategy,
            name=f"{name}-trainer",
        )
        self.rollout = (
            placement_group(
                [rollout_bundle(cfg)] * workers,
                strategy=rc.rollout_placement_strategy,
                name=f"{name}-rollout",
            )
            if workers
            else None
        )
        try:
            self._wait(rc.placement_timeout_s)
        except BaseException:
            self.remove()
            raise

    def _wait(self, timeout_s: float) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        groups = [("trainer", self.trainer), ("rollout", self.rollout)]
        for role, group in groups:
            if group is None:
                continue
            left = max(0.0, deadline - time.monotonic())
            if not group.wait(left):
                raise ConfigError(self._refusal(role, timeout_s))

    def _refusal(self, role: str, timeout_s: float) -> str:
        import ray

        rc = self.cfg.ray
        group = self.trainer if role == "trainer" else self.rollout
        strategy = rc.placement_strategy if role == "trainer" else rc.rollout_placement_strategy
        key = "ray.placement_strategy" if role == "trainer" else "ray.rollout_placement_strategy"
        nodes = "; ".join(
            f"{n['NodeManagerAddress']}: {_resources_text(n.get('Resources', {}))}"
            for n in ray.nodes()
            if n.get("Alive")
        )
        return (
            f"{key}: the cluster did not grant the {role} placement group within "
            f"ray.placement_timeout_s={timeout_s:g} s: {strategy} of "
            f"{group.bundle_specs if group is not None else []}; the cluster's nodes: {nodes}"
        )

    def slot(self, name: str) -> Slot | None:
        """The bundle of the role named ``name``; None for a role outside the groups (a
        worker id past rollout.num_workers: Ray places it where its resources fit)."""
        rank, worker = rank_of(name), worker_of(name)
        if rank is not None and rank < trainer_ranks(self.cfg):
            return Slot(self.trainer, rank)
        workers = self.cfg.actor_rollout_ref.rollout.num_workers
        if worker is not None and self.rollout is not None and worker < workers:
            return Slot(self.rollout, worker)
        return None

    def node_ip(self, group: Any, index: int) -> str:
        """The IP of the node the group's bundle ``index`` was reserved on."""
        import ray
        from ray.util.placement_group import placement_group_table

        node_id = placement_group_table(group)["bundles_to_node_id"][index]
        for node in ray.nodes():
            if node["NodeID"] == node_id:
                return str(node["NodeManagerAddress"])
        raise RuntimeError(f"bundle {index}'s node {node_id} is not in the cluster")

    def trainer_ip(self) -> str:
        """Where the trainer (its rank 0) runs: its bundle's node's IP."""
        return self.node_ip(self.trainer, 0)

    def remove(self) -> None:
        import contextlib

        from ray.util.placement_group import remove_placement_group

        for group in (self.trainer, self.rollout):
            if group is not None:
                with contextlib.suppress(Exception):  # a cluster already gone
                    remove_placement_group(group)


def _resources_text(resources: dict[str, float]) -> str:
    from asyncrl.launch.ray_node import custom_resources

    shown = {k: resources[k] for k in ("CPU", "GPU") if k in resources}
    labels = custom_resources(resources)
    return ", ".join([*(f"{k} {v:g}" for k, v in shown.items()), *labels]) or "nothing"


def _need_node_resources(cfg: RunConfig) -> None:
    """A node resource no node of the cluster has fails the launch now, naming its key (a
    group asking for it would wait out ray.placement_timeout_s)."""
    import ray

    have = set(ray.cluster_resources())
    rc = cfg.ray
    for key, name in (
        ("ray.trainer_node_resource", rc.trainer_node_resource),
        ("ray.rollout_node_resource", rc.rollout_node_resource),
    ):
        if name is not None and name not in have:
            raise ConfigError(
                f"{key}: no node of the Ray cluster has the resource {name!r} (start the "
                f"role's nodes with ray start --resources='{{\"{name}\": 1}}'); the cluster's "
                f"custom resources: {', '.join(sorted(_labels(have))) or 'none'}"
            )


def _labels(names: set[str]) -> list[str]:
    from asyncrl.launch.ray_node import custom_resources

    return custom_resources(dict.fromkeys(names, 1.0))
