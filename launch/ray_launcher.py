"""``asyncrl run --launcher ray``: the trainer and rollout workers as Ray actors.

1. Ray is joined (``ray.address`` or ``RAY_ADDRESS``) or started (a local Ray of
   ``ray.num_cpus``).
2. The placement groups are reserved (``launch/ray_placement.py``): one bundle per trainer
   rank, laid out with ``ray.placement_strategy``, one per rollout worker, with
   ``ray.rollout_placement_strategy``; ``ray.trainer_node_resource`` and
   ``ray.rollout_node_resource`` keep each role on its own nodes.
3. ``sync.master_addr`` left at the loopback becomes the IP of the trainer's node (its rank
   0's bundle), written into the run's ``config.yaml`` before any role reads it: the workers
   find the trainer's rendezvous there, the ranks their MASTER_ADDR.
4. Each role is one Ray actor in its bundle that records where it runs
   (``launch/ray_node.py``: ``run_dir/placement/<role>.jsonl`` and the first line of its log;
   ``asyncrl inspect placement RUN``) and runs the very command the local launcher would run
   (``asyncrl train`` / ``asyncrl rollout``) as its child, which dies with the actor.

Ray only places and supervises; the processes still talk only through Kafka and the weight
collective, so a Ray run is the same run. The actor sets ``CUDA_VISIBLE_DEVICES`` for its
GPUs, and the child inherits it. Across nodes, every node needs the same Python environment,
the run directory on a shared path (the resolved config, logs, placement records) and a broker
all can reach (``kafka.bootstrap_servers``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.config.load import dump_config
from asyncrl.launch.ray_placement import Placement, rank_of

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
"""``sync.master_addr`` values that say "this machine": under Ray, the trainer's node's IP."""


class RayProcess:
    """A role running in a Ray actor, with the part of ``subprocess.Popen`` the launcher uses."""

    def __init__(self, actor: Any, ref: Any) -> None:
        self.actor, self.ref = actor, ref
        self.returncode: int | None = None

    def poll(self) -> int | None:
        import ray

        if self.returncode is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                try:
                    self.returncode = int(ray.get(self.ref))
                except ray.exceptions.RayError:  # the actor died (killed, node lost)
                    self.returncode = -9
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import ray

        ready, _ = ray.wait([self.ref], timeout=timeout)
        if not ready:
            raise subprocess.TimeoutExpired("ray actor", timeout or 0)
        rc = self.poll()
        assert rc is not None
        return rc

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the role's process; the actor is killed if it does not answer."""
        import ray

        try:
            ray.get(self.actor.send_signal.remote(int(sig)), timeout=10)
        except ray.exceptions.RayError:
            self.kill()

    def terminate(self) -> None:
        """SIGTERM to the role's process, as the local launcher sends it (the trainer then
        checkpoints its last step)."""
        self.send_signal(signal.SIGTERM)


def _role_actor_class():
    import ray

    @ray.remote(max_concurrency=2)
    class RoleProcess:
        """Runs one role's command as a child process; returns its exit code."""

        def run(
            self,
            cmd: list[str],
            log_path: str,
            env: dict[str, str],
            run_dir: str,
            role: str,
            placed: dict[str, Any],
        ) -> int:
            from asyncrl.launch.process import spawn
            from asyncrl.launch.ray_node import record_start, this_node

            os.environ.update(env)
            record = record_start(Path(run_dir), role, Path(log_path), this_node(), placed)
            self.proc, _ = spawn(cmd, Path(log_path))
            with open(log_path, "a") as log:  # the pid beside the node, for whoever logs in
                log.write(f"asyncrl: {role} is pid {self.proc.pid} on {record['hostname']}\n")
            return self.proc.wait()

        def send_signal(self, sig: int) -> None:
            """Runs beside ``run`` (max_concurrency=2)."""
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.send_signal(sig)

    return RoleProcess


class RayLauncher:
    """Starts (or joins) Ray, reserves the run's placement groups and places roles in them."""

    def __init__(self, cfg: RunConfig) -> None:
        import ray

        rc = cfg.ray
        address = rc.address or os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address:
                kwargs["address"] = address
            elif rc.num_cpus is not None:
                kwargs["num_cpus"] = rc.num_cpus
            ray.init(**kwargs)
        self.cfg = cfg
        self.placement = Placement(cfg)
        self.trainer_ip = self.placement.trainer_ip()
        if cfg.sync.master_addr in LOOPBACK:
            cfg.sync.master_addr = self.trainer_ip
            dump_config(cfg, cfg.run_dir / "config.yaml")  # what every role reads
        self._actor = _role_actor_class()
        # Passed on to the roles: tracing and hub settings of the launching shell.
        self.env = {k: v for k, v in os.environ.items() if k.startswith(("OTEL_", "HF_", "KAFKA_"))}

    def describe(self) -> str:
        """One line for the launcher's console: the groups and the trainer's address."""
        rc = self.cfg.ray
        return (
            f"trainer group {rc.placement_strategy}, workers' group "
            f"{rc.rollout_placement_strategy}; the trainer's node {self.trainer_ip} "
            f"(sync.master_addr={self.cfg.sync.master_addr})"
        )

    def spawn(
        self, name: str, cmd: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> tuple[RayProcess, Path]:
        """Start role ``name`` in its bundle; ``env`` added to its environment (a trainer
        rank's torchrun variables: MASTER_ADDR is then the trainer's node, and LOCAL_RANK 0,
        since the actor's process sees only its own GPUs)."""
        rc = self.cfg.ray
        rank = rank_of(name)
        cpus, gpus = (
            (rc.trainer_num_cpus, rc.trainer_num_gpus)
            if rank is not None
            else (rc.rollout_num_cpus, rc.rollout_num_gpus)
        )
        role_env = {**self.env, **(env or {})}
        if rank is not None and "MASTER_ADDR" in role_env:
            role_env |= {"MASTER_ADDR": self.trainer_ip, "LOCAL_RANK": "0"}
            role_env["LOCAL_WORLD_SIZE"] = "1"
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus}
        placed: dict[str, Any] = {"bundle": None, "placement_group": None}
        if (slot := self.placement.slot(name)) is not None:
            options["scheduling_strategy"] = slot.strategy()
            placed = {"bundle": slot.index, "placement_group": slot.group.id.hex()}
        if rank is not None:  # where this rank (the trainer) meets the others and the workers
            placed["master_addr"] = role_env.get("MASTER_ADDR", self.cfg.sync.master_addr)
        actor = self._actor.options(**options).remote()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        ref = actor.run.remote(cmd, str(log_path), role_env, str(self.cfg.run_dir), name, placed)
        return RayProcess(actor, ref), log_path

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            self.placement.remove()
            ray.shutdown()
