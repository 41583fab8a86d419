"""``launcher=ray``'s placement keys: bad values refused at start-up naming the key, each
role's bundle, and which bundle each of the launcher's processes goes to. No Ray started
(tests/integration/test_ray_placement.py places a run on a three-node cluster)."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.preflight import check_startable
from asyncrl.launch.ray_placement import (
    NODE_RESOURCE_SHARE,
    placement_checks,
    rank_of,
    rollout_bundle,
    trainer_bundle,
    worker_of,
)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("ray.placement_strategy=pack", "ray.placement_strategy"),
        ("ray.rollout_placement_strategy=SPREAD_OUT", "ray.rollout_placement_strategy"),
        ("ray.trainer_node_resource=GPU", "ray.trainer_node_resource"),
        ("ray.rollout_node_resource=' '", "ray.rollout_node_resource"),
        ("ray.placement_timeout_s=0", "ray.placement_timeout_s"),
    ],
)
def test_a_bad_placement_value_is_refused_naming_its_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=["launcher=ray", override])


def test_each_bundle_holds_its_roles_resources_and_a_share_of_its_nodes_mark() -> None:
    cfg = load_config(
        overrides=[
            "ray.trainer_num_gpus=1",
            "ray.rollout_num_cpus=2",
            "ray.trainer_node_resource=trainer_node",
        ]
    )
    assert trainer_bundle(cfg) == {"CPU": 1.0, "GPU": 1.0, "trainer_node": NODE_RESOURCE_SHARE}
    assert rollout_bundle(cfg) == {"CPU": 2.0}  # no GPU asked: none in the bundle


def test_a_bundle_that_reserves_nothing_is_refused_at_start_up_naming_the_key() -> None:
    empty = ["launcher=ray", "ray.rollout_num_cpus=0"]
    failed = [c for c in placement_checks(load_config(overrides=empty)) if c.ok is False]
    assert [c.key for c in failed] == ["ray.rollout_num_cpus"]
    assert "Ray places no empty bundle" in failed[0].detail
    with pytest.raises(ConfigError, match=r"ray\.rollout_num_cpus"):
        check_startable(load_config(overrides=empty), "run")
    # A node mark alone is a reservation: the role goes to its nodes, taking no CPU.
    marked = load_config(overrides=[*empty, "ray.rollout_node_resource=rollout_node"])
    assert all(c.ok for c in placement_checks(marked))


def test_the_launchers_process_names_map_to_their_bundles() -> None:
    assert [rank_of(n) for n in ("trainer", "trainer-rank-3", "rollout-0", "trainer-x")] == [
        0,
        3,
        None,
        None,
    ]
    assert [worker_of(n) for n in ("rollout-0", "rollout-12", "trainer", "rollout-")] == [
        0,
        12,
        None,
        None,
    ]
