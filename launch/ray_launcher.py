"""``asyncrl run --launcher ray``: the trainer and rollout workers as Ray actors.

Each role is one Ray actor that reserves the role's CPUs/GPUs (``ray.trainer_*``,
``ray.rollout_*``) on the cluster and runs the very command the local launcher would run
(``asyncrl train`` / ``asyncrl rollout``) as its child, which dies with the actor. Ray only
places and supervises; the processes still talk only through Kafka and the weight collective,
so a Ray run is the same run. The actor sets ``CUDA_VISIBLE_DEVICES`` for its GPUs, and the
child inherits it.

Across nodes, every node needs the same Python environment, the run directory on a shared
path (the resolved config and logs), a broker all can reach (``kafka.bootstrap_servers``) and
``sync.master_addr`` set to an address of the trainer's node reachable by the workers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig


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

    def terminate(self) -> None:
        """SIGTERM to the role's process, as the local launcher sends it (the trainer then
        checkpoints its last step); the actor is killed if it does not answer."""
        import ray

        try:
            ray.get(self.actor.terminate.remote(), timeout=10)
        except ray.exceptions.RayError:
            self.kill()


def _role_actor_class():
    import ray

    @ray.remote(max_concurrency=2)
    class RoleProcess:
        """Runs one role's command as a child process; returns its exit code."""

        def run(self, cmd: list[str], log_path: str, env: dict[str, str]) -> int:
            from asyncrl.launch.process import spawn

            os.environ.update(env)
            self.proc, _ = spawn(cmd, Path(log_path))
            return self.proc.wait()

        def terminate(self) -> None:
            """Runs beside ``run`` (max_concurrency=2)."""
            proc = getattr(self, "proc", None)
            if proc is not None and proc.poll() is None:
                proc.terminate()

    return RoleProcess


class RayLauncher:
    """Starts (or joins) Ray and places roles on it."""

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
        self._actor = _role_actor_class()
        # Passed on to the roles: tracing and hub settings of the launching shell.
        self.env = {k: v for k, v in os.environ.items() if k.startswith(("OTEL_", "HF_", "KAFKA_"))}

    def spawn(self, name: str, cmd: list[str], log_path: Path) -> tuple[RayProcess, Path]:
        rc = self.cfg.ray
        cpus, gpus = (
            (rc.trainer_num_cpus, rc.trainer_num_gpus)
            if name == "trainer"
            else (rc.rollout_num_cpus, rc.rollout_num_gpus)
        )
        actor = self._actor.options(name=None, num_cpus=cpus, num_gpus=gpus).remote()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        return RayProcess(actor, actor.run.remote(cmd, str(log_path), self.env)), log_path

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            ray.shutdown()
