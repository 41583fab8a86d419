"""The ``ray`` section: placement on a Ray cluster."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from asyncrl.config.base import MAX_WAIT_S, Strict

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
"""Ray's placement-group strategies (``ray.util.placement_group``'s ``strategy``)."""

RAY_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
"""Ray's own resource names: not a node resource a role's nodes are picked by."""


class RayConfig(Strict):
    """Placement on a Ray cluster (launcher=ray, docs/cluster.md)."""

    address: str | None = None
    """Ray cluster to join (e.g. ray://head:10001 or auto); unset: RAY_ADDRESS, else a local Ray."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of a local Ray started by the launcher (unset: the machine's)."""
    trainer_num_cpus: float = Field(1, ge=0)
    """CPUs the trainer's actor reserves."""
    trainer_num_gpus: float = Field(0, ge=0)
    """GPUs the trainer's actor reserves (its process sees them as CUDA_VISIBLE_DEVICES)."""
    rollout_num_cpus: float = Field(1, ge=0)
    """CPUs each rollout worker's actor reserves."""
    rollout_num_gpus: float = Field(0, ge=0)
    """GPUs each rollout worker's actor reserves."""
    placement_strategy: PlacementStrategy = "PACK"
    """How the trainer's placement group (one bundle per trainer rank) lies on the nodes:
    PACK (as few nodes as fit, the default), SPREAD (as many as fit), STRICT_PACK (one node
    or none), STRICT_SPREAD (a node per rank or none). Ray's strategies, as verl's resource
    pools use them."""
    rollout_placement_strategy: PlacementStrategy = "PACK"
    """The same for the rollout workers' placement group (one bundle per worker), a group of
    its own, so the workers may lie on other nodes than the trainer."""
    trainer_node_resource: str | None = None
    """A custom resource only the trainer's nodes have (a node started with
    ``ray start --resources='{"trainer_node": 1}'``): each trainer bundle asks a thousandth
    of it, so the trainer runs on those nodes only. Unset: any node with the CPUs/GPUs."""
    rollout_node_resource: str | None = None
    """The same for the rollout workers' nodes."""
    placement_timeout_s: float = Field(300.0, gt=0, le=MAX_WAIT_S)
    """How long the launcher waits for the cluster to grant both placement groups before it
    fails, saying what it asked and what the cluster has."""

    @field_validator("trainer_node_resource", "rollout_node_resource")
    @classmethod
    def _a_custom_resource(cls, name: str | None) -> str | None:
        if name is not None and (not name.strip() or name in RAY_RESOURCES):
            raise ValueError(
                f"{name!r} is not a custom resource name (CPU, GPU, memory and "
                "object_store_memory are Ray's own; set the CPUs/GPUs with *_num_cpus/gpus)"
            )
        return name
