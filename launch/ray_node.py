"""Where each role of a Ray run ran: one record per process start, written on its node.

The Ray actor of a role describes the node it was placed on (Ray's node id, its IP, the host
name, the node's custom resources, the placement group and bundle) and, before it starts the
role's process, appends that record to ``run_dir/placement/<role>.jsonl`` and writes it as the
first line of the role's log. A restarted role appends another record, so the file is the
role's placement history; ``asyncrl inspect placement RUN`` reads them all
(``ops/inspect_placement.py``). One file per role: only one process of a role runs at a time,
so no two nodes write the same file.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from asyncrl.config.ray import RAY_RESOURCES

PLACEMENT_DIR = "placement"
"""Under the run's directory: one ``<role>.jsonl`` per role placed by Ray."""


def placement_path(run_dir: Path, role: str) -> Path:
    return Path(run_dir) / PLACEMENT_DIR / f"{role}.jsonl"


def custom_resources(resources: dict[str, float]) -> list[str]:
    """A node's resources a user named (``node_a``, ``trainer_node``), not Ray's own (CPU,
    GPU, memory, the ``node:<ip>`` and placement-group resources Ray adds)."""
    return sorted(
        name
        for name in resources
        if name not in RAY_RESOURCES
        and not name.startswith(("node:", "accelerator_type:"))
        and "_group_" not in name  # a placement group's bundle resources
    )


def this_node() -> dict[str, Any]:
    """The node the calling Ray worker runs on."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    resources: dict[str, float] = {}
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            resources = node.get("Resources", {})
    return {
        "node_id": node_id,
        "ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "resources": custom_resources(resources),
    }


def record_start(
    run_dir: Path, role: str, log_path: Path, node: dict[str, Any], placed: dict[str, Any]
) -> dict[str, Any]:
    """Append the role's start on ``node`` (``placed``: its placement group and bundle) to
    its placement file and its log; the record written."""
    record = {"role": role, "time": time.time(), **node, **placed}
    path = placement_path(run_dir, role)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        log.write(f"asyncrl: {role} placed by Ray: {describe(record)}\n")
    return record


def describe(record: dict[str, Any]) -> str:
    """One line: node, IP, host, the node's resources, the bundle."""
    labels = ",".join(record.get("resources", [])) or "-"
    bundle = record.get("bundle")
    where = f", bundle {bundle}" if bundle is not None else ""
    return (
        f"node {record['node_id'][:12]} ip {record['ip']} host {record['hostname']} "
        f"(resources {labels}{where})"
    )


def read_placements(run_dir: Path) -> list[dict[str, Any]]:
    """Every start recorded under ``run_dir``, in time order (empty: no Ray placement)."""
    records: list[dict[str, Any]] = []
    folder = Path(run_dir) / PLACEMENT_DIR
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return sorted(records, key=lambda r: r.get("time", 0.0))
