"""``asyncrl run --launcher ray`` on a simulated three-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``): each node has its own resources, the trainer goes to a
trainer node and the worker to the rollout node, the run finishes with a clean audit, the
weight sync's rendezvous is the trainer's node (not the loopback), and ``asyncrl inspect
placement`` shows where each role ran."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stdout
from typing import Any

import pytest
import yaml
from rich.console import Console

from asyncrl.launch.launcher import run
from asyncrl.launch.ray_node import read_placements

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.cluster]

STORE = 80 * 1024 * 1024
"""Each node's object store (Ray's least is 75 MiB): the roles put nothing in it."""


@pytest.fixture(scope="module")
def three_nodes() -> Iterator[Any]:
    """A head node with the rollout workers' mark and two nodes with the trainer's, each
    named by a resource of its own (node_a, node_b, node_c), one CPU each."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_c": 1, "rollout_node": 1},
            "object_store_memory": STORE,
            "include_dashboard": False,
        },
    )
    try:
        for name in ("node_a", "node_b"):
            cluster.add_node(
                num_cpus=1, resources={name: 1, "trainer_node": 1}, object_store_memory=STORE
            )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_roles_run_on_their_own_nodes_and_inspect_shows_where(
    make_run_cfg, quick_policy, three_nodes
):
    from asyncrl.cli import main
    from asyncrl.ops.audit import audit_run

    cfg = make_run_cfg(
        *quick_policy,
        "launcher=ray",
        f"ray.address={three_nodes.address}",
        "ray.placement_strategy=SPREAD",
        "ray.trainer_node_resource=trainer_node",
        "ray.rollout_node_resource=rollout_node",
        "actor_rollout_ref.rollout.num_workers=1",
        "trainer.total_training_steps=3",
        "trainer.test_freq=0",
        create_topics=False,
    )
    out = io.StringIO()
    summary = run(cfg, Console(file=out, width=200))
    assert summary["step"] == 3, out.getvalue()

    starts = {r["role"]: r for r in read_placements(cfg.run_dir)}
    assert set(starts) == {"trainer", "rollout-0"}
    trainer, worker = starts["trainer"], starts["rollout-0"]
    assert "trainer_node" in trainer["resources"] and "rollout_node" in worker["resources"]
    assert trainer["node_id"] != worker["node_id"]
    assert (trainer["bundle"], worker["bundle"]) == (0, 0)
    # The workers found the trainer's rendezvous at its node's address, as config.yaml says.
    saved = yaml.safe_load((cfg.run_dir / "config.yaml").read_text())
    assert saved["sync"]["master_addr"] == trainer["ip"] != "127.0.0.1"
    assert trainer["master_addr"] == trainer["ip"] and "master_addr" not in worker
    assert f"sync.master_addr={trainer['ip']}" in out.getvalue()
    assert "placed by Ray: node" in (cfg.run_dir / "logs" / "trainer.log").read_text()

    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    assert report.ok, report.to_dict()

    shown = io.StringIO()
    with redirect_stdout(shown):
        assert main(["inspect", "placement", str(cfg.run_dir)]) == 0
    text = shown.getvalue()
    assert "trainer" in text and "rollout-0" in text and trainer["ip"] in text
    assert f"node {trainer['node_id'][:12]}" in text and "trainer_node" in text
    with redirect_stdout(shown := io.StringIO()):
        assert main(["inspect", "placement", str(cfg.run_dir), "--json"]) == 0
    rows = [json.loads(line) for line in shown.getvalue().splitlines()]
    assert {r["role"]: r["node"] for r in rows} == {
        "trainer": trainer["node_id"],
        "rollout-0": worker["node_id"],
    }


def test_two_trainer_ranks_on_two_nodes_and_the_worker_on_a_third(
    make_run_cfg, quick_policy, three_nodes
):
    """Issue 48's placement: the trainer's two ranks spread over the two trainer nodes
    (STRICT_SPREAD, a bundle each), the worker on the rollout node, MASTER_ADDR rank 0's node."""
    from asyncrl.ops.audit import audit_run

    cfg = make_run_cfg(
        *quick_policy,
        "launcher=ray",
        f"ray.address={three_nodes.address}",
        "ray.placement_strategy=STRICT_SPREAD",
        "ray.trainer_node_resource=trainer_node",
        "ray.rollout_node_resource=rollout_node",
        "trainer.nnodes=2",
        "trainer.device=cpu",
        "actor_rollout_ref.nccl_timeout=60",
        "actor_rollout_ref.rollout.num_workers=1",
        "trainer.total_training_steps=3",
        "trainer.test_freq=0",
        create_topics=False,
    )
    out = io.StringIO()
    summary = run(cfg, Console(file=out, width=200))
    assert summary["step"] == 3, out.getvalue()

    starts = {r["role"]: r for r in read_placements(cfg.run_dir)}
    assert set(starts) == {"trainer", "trainer-rank-1", "rollout-0"}
    ranks = [starts["trainer"], starts["trainer-rank-1"]]
    assert [r["bundle"] for r in ranks] == [0, 1]
    assert all("trainer_node" in r["resources"] for r in ranks)
    nodes = {r["node_id"] for r in ranks} | {starts["rollout-0"]["node_id"]}
    assert len(nodes) == 3  # each process on a node of its own
    assert ranks[1]["master_addr"] == ranks[0]["ip"]  # rank 1 met rank 0 at its node
    follower = (cfg.run_dir / "logs" / "trainer-rank-1.log").read_text()
    assert "trainer rank 1/2 on " in follower and "placed by Ray: node" in follower
    report = audit_run(cfg, cfg.kafka.bootstrap_servers)
    assert report.ok, report.to_dict()
