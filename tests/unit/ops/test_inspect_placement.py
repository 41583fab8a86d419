"""``asyncrl inspect placement RUN`` reads the placement records a Ray run's actors wrote
(``launch/ray_node.py``), one row per process start, and says which roles ran on each node."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from asyncrl.launch.ray_node import describe, read_placements, record_start
from asyncrl.ops.inspect_placement import latest_by_node, placement_rows, print_placement

NODE_A = {"node_id": "a" * 56, "ip": "10.0.0.1", "hostname": "gpu-a", "resources": ["node_a"]}
NODE_B = {"node_id": "b" * 56, "ip": "10.0.0.2", "hostname": "cpu-b", "resources": []}


def _place(run_dir: Path, role: str, node: dict, bundle: int) -> None:
    placed = {"bundle": bundle, "placement_group": "pg"}
    record_start(run_dir, role, run_dir / "logs" / f"{role}.log", node, placed)


def test_each_start_is_a_record_and_a_line_of_the_roles_log(tmp_path: Path) -> None:
    _place(tmp_path, "trainer", NODE_A, 0)
    _place(tmp_path, "rollout-0", NODE_B, 0)
    _place(tmp_path, "trainer", NODE_B, 0)  # restarted elsewhere
    records = read_placements(tmp_path)
    assert [(r["role"], r["ip"]) for r in records] == [
        ("trainer", "10.0.0.1"),
        ("rollout-0", "10.0.0.2"),
        ("trainer", "10.0.0.2"),
    ]
    log = (tmp_path / "logs" / "trainer.log").read_text().splitlines()
    assert log == [f"asyncrl: trainer placed by Ray: {describe(r)}" for r in records[::2]]
    assert "ip 10.0.0.1 host gpu-a (resources node_a, bundle 0)" in log[0]
    # The latest start of each role counts: both ended on node B.
    assert latest_by_node(placement_rows(tmp_path)) == {"b" * 56: ["trainer", "rollout-0"]}


def test_the_table_and_json_show_where_each_role_ran(tmp_path: Path) -> None:
    _place(tmp_path, "trainer", NODE_A, 0)
    _place(tmp_path, "rollout-0", NODE_B, 0)
    out = io.StringIO()
    print_placement(tmp_path, Console(file=out, width=200))
    text = out.getvalue()
    assert "2 process starts" in text
    assert f"node {'a' * 12} 10.0.0.1 (node_a): trainer" in text
    assert f"node {'b' * 12} 10.0.0.2: rollout-0" in text
    out = io.StringIO()
    print_placement(tmp_path, Console(file=out), as_json=True)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["role"], r["hostname"], r["bundle"]) for r in rows] == [
        ("trainer", "gpu-a", 0),
        ("rollout-0", "cpu-b", 0),
    ]


def test_a_run_with_no_records_says_so(tmp_path: Path) -> None:
    out = io.StringIO()
    print_placement(tmp_path, Console(file=out, width=200))
    assert "no placement recorded" in out.getvalue()
