"""``asyncrl inspect placement RUN``: where each role of a run ran.

A Ray run's actors recorded their node at each start (``launch/ray_node.py``:
``run_dir/placement/<role>.jsonl``); this reads the records back, one row per process start
(a restart is a row of its own; a trainer rank's with the address it met the others and the
workers at), and a line per node with the roles last placed there. A
local run records none: every role ran on the launcher's machine. Read from the run's
directory, with no broker.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.launch.ray_node import PLACEMENT_DIR, read_placements


def placement_rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per recorded process start, in time order."""
    return [
        {
            "time": datetime.fromtimestamp(r["time"]).astimezone().isoformat(timespec="seconds"),
            "role": r["role"],
            "node": r["node_id"],
            "ip": r["ip"],
            "hostname": r["hostname"],
            "resources": r.get("resources", []),
            "bundle": r.get("bundle"),
            "placement_group": r.get("placement_group"),
            "master_addr": r.get("master_addr"),
        }
        for r in read_placements(run_dir)
    ]


def latest_by_node(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """{node id: the roles whose latest start was there}."""
    latest = {row["role"]: row["node"] for row in rows}  # rows in time order
    nodes: dict[str, list[str]] = {}
    for role, node in latest.items():
        nodes.setdefault(node, []).append(role)
    return nodes


def print_placement(run_dir: Path, console: Console, as_json: bool = False) -> None:
    """The placement records of the run in ``run_dir``, as JSON lines or a table."""
    rows = placement_rows(run_dir)
    if as_json:
        for row in rows:
            console.file.write(json.dumps(row) + "\n")
        return
    if not rows:
        console.print(
            f"{run_dir / PLACEMENT_DIR}: no placement recorded (only launcher=ray records one; "
            "a local run's roles all ran on the launcher's machine)"
        )
        return
    table = Table(title=f"placement of {run_dir.name}: {len(rows)} process starts")
    for col in ("time", "role", "node", "ip", "hostname", "resources", "bundle", "master_addr"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(
            row["time"][11:19],
            row["role"],
            row["node"][:12],
            row["ip"],
            row["hostname"],
            ",".join(row["resources"]) or "-",
            "-" if row["bundle"] is None else str(row["bundle"]),
            row["master_addr"] or "-",
        )
    console.print(table)
    by_ip = {row["node"]: (row["ip"], row["resources"]) for row in rows}
    for node, roles in latest_by_node(rows).items():
        ip, resources = by_ip[node]
        labels = f" ({','.join(resources)})" if resources else ""
        console.print(f"node {node[:12]} {ip}{labels}: {', '.join(roles)}")
