"""The rollout worker's loop, broker-free: a real worker (engine, agent runner, budget, in-flight
bookkeeping) over ``asyncrl.testing``'s in-memory broker and weight transport, with a scripted
trainer on the other side of the sync hand-shake. The broker tests in tests/integration cover
the same paths over Kafka and the collective."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.models.warm_start import load_policy
from asyncrl.producers.worker import RolloutWorker
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas import control as ev
from asyncrl.schemas.partial import TAG as PARTIAL_TAG
from asyncrl.schemas.partial import PartialSample, decode_partial, encode_partial
from asyncrl.schemas.prompt import decode_prompt
from asyncrl.schemas.sample import TAG as SAMPLE_TAG
from asyncrl.schemas.sample import (
    WORKER_HEADER,
    Sample,
    Trajectory,
    decode_sample,
    encode_sample,
)
from asyncrl.testing import LocalWeights, MemoryBroker, ScriptedTrainer, worker_io
from tests.helpers import SMALL, parity_reward, token_logprob_errors

WARM = ["actor_rollout_ref.model.warmup_steps=100"]
STEPPED = "actor_rollout_ref.rollout.engine_thread=false"
"""The worker steps its engine between two turns of its loop, so a test can act before the
k-th decoding step (``Run.before_decoding_step``); the other tests serve the engine from its
own thread, the default."""


def _cfg(tmp_path, *overrides):
    return load_config(
        overrides=[
            *SMALL,
            *WARM,
            f"output_dir={tmp_path}",
            "run_id=mem",
            "actor_rollout_ref.rollout.num_workers=1",
            "async_training.staleness_threshold=0.5",  # 6 samples per version, 4 at a time
            *overrides,
        ]
    )


class Run:
    """A worker wired to a memory broker, a scripted trainer and a script of what happens as
    the run goes (``when_published(k, action)``: after the k-th sample;
    ``before_decoding_step(k, action)``: before the worker's k-th decoding step)."""

    def __init__(self, cfg, prompts: int = 16) -> None:
        self.cfg = cfg
        self.broker = MemoryBroker()
        self.broker.feed(cfg, prompts)
        weights = LocalWeights()
        self.model, _ = load_policy(cfg)
        self.trainer = ScriptedTrainer(cfg, self.broker, weights, self.model)
        self.sources: list = []
        """The worker's prompt sources (a test revokes their partition)."""
        io = worker_io(cfg, self.broker, weights, prompts=self.sources)
        self.worker = RolloutWorker(cfg, 0, io=io)
        self.script: dict[int, object] = {}
        self.broker.reactions.append(self._on_record)

    def when_published(self, k: int, action) -> None:
        self.script[k] = action

    def before_decoding_step(self, k: int, action) -> None:
        """Needs a worker that steps its engine itself (``STEPPED``): one on its own thread
        decodes at its own pace."""
        assert not self.cfg.actor_rollout_ref.rollout.engine_thread, "use STEPPED"
        step, decoded = self.worker.runner.step, [0]

        def counted(timeout: float = 0.0):
            decoded[0] += 1
            if decoded[0] == k:
                action()
            return step(timeout)

        self.worker.runner.step = counted

    def sync_new_weights(self) -> None:
        """The trainer's next version: new weights (what a training step would do), a sync."""
        _perturb(self.model)
        self.trainer.request_sync()

    def _on_record(self, rec) -> None:
        if rec.topic == self.cfg.topic("samples"):
            action = self.script.pop(len(self.broker.topics[rec.topic]), None)
            if action is not None:
                action()

    def run(self) -> int:
        return self.worker.run()

    def events(self, worker: int = 0) -> list[ev.ControlEvent]:
        """The control events of the worker and the trainer's sync requests, in log order."""
        return [
            e
            for e in self.broker.events(self.cfg)
            if e.worker == worker or isinstance(e, (ev.SyncRequested, ev.RunFinished))
        ]

    def samples(self) -> list[Sample]:
        return self.broker.read(self.cfg, "samples", decode_sample)

    def partials(self) -> list[PartialSample]:
        return self.broker.read(self.cfg, "partials", decode_partial)


def _kinds(events) -> list[str]:
    return [f"{type(e).__name__}({e.version})" for e in events]


def _assert_paused_sync(kinds: list[str], version: int) -> None:
    """The worker's hand-shake of a paused sync, in order, from the trainer's request on."""
    at = kinds.index(f"SyncRequested({version})")
    want = ("SyncRequested", "RolloutPaused", "WeightsLoaded", "RolloutResumed")
    assert kinds[at : at + 4] == [f"{k}({version})" for k in want]


def _perturb(model: torch.nn.Module) -> None:
    """New weights for the next version (what a training step would do)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_mode_c_sync_finishes_in_flight_samples_then_loads_the_new_version(tmp_path):
    run = Run(_cfg(tmp_path))

    def sync() -> None:
        _perturb(run.model)
        run.trainer.consumed = {"0": 2}
        run.trainer.request_sync()

    run.when_published(2, sync)
    run.when_published(8, run.trainer.finish)
    assert run.run() >= 8

    kinds = _kinds(run.events())
    assert kinds[:3] == ["WorkerStarted(0)", "WeightsLoaded(0)", "RolloutResumed(0)"]
    _assert_paused_sync(kinds, 1)
    assert kinds[-1] == "WorkerStopped(1)"
    events = run.events()
    paused = next(e for e in events if isinstance(e, ev.RolloutPaused))
    loaded = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    resumed = [e for e in events if isinstance(e, ev.RolloutResumed)]
    # Mode (c): the samples in flight at the request finished under version 0 before the
    # pause, so the worker paused with nothing interrupted.
    assert paused.n_partial == 0 and not run.partials()
    assert paused.produced >= 2
    samples = run.samples()
    versions = [t.param_version for s in samples for t in s.trajectories]
    assert versions == sorted(versions) and set(versions) == {0, 1}
    assert sum(1 for s in samples if s.trajectories[0].param_version == 0) == paused.produced
    # The budget of version 1 counts what the trainer has not consumed yet as stale.
    assert resumed[1].num_stale == paused.produced - 2
    assert resumed[1].budget == run.cfg.max_samples_per_version - resumed[1].num_stale
    assert all(e.checksum_ok for e in loaded)
    assert _same_weights(run.worker.engine.model, run.model)
    assert run.sources[0].closed


def test_a_stopped_worker_leaves_the_prompts_group_and_says_why(tmp_path):
    """Stopped while the run goes on (SIGTERM), a worker closes its prompts (the group hands
    what it held to the next owner) and says it stopped, not that the run finished."""
    run = Run(_cfg(tmp_path))
    run.when_published(2, run.worker.stop)
    assert run.run() >= 2
    assert run.sources[0].closed
    stopped = [e for e in run.events() if isinstance(e, ev.WorkerStopped)]
    assert [e.reason for e in stopped] == ["stopped"]


def test_a_bf16_worker_holds_the_float32_trainers_weights_rounded_and_verifies_them(tmp_path):
    """rollout.dtype=bfloat16: the worker's copy is bf16, each version arrives cast (checksums
    agree, so checksum_ok), and its recorded logprobs are the bf16 policy's: near the float32
    trainer's recomputation, not equal to it."""
    from asyncrl.consumers.grpo import rollout_logprob_errors

    run = Run(_cfg(tmp_path, "actor_rollout_ref.rollout.dtype=bfloat16"))

    def sync() -> None:
        run.trainer.consumed = {"0": 2}  # the version's budget: 6 - the 4 still unconsumed
        run.sync_new_weights()

    run.when_published(2, sync)
    run.when_published(8, run.trainer.finish)
    assert run.run() >= 8
    worker_model = run.worker.engine.model
    assert {p.dtype for p in worker_model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    loaded = [e for e in run.events() if isinstance(e, ev.WeightsLoaded)]
    assert [e.version for e in loaded] == [0, 1] and all(e.checksum_ok for e in loaded)
    for name, p in worker_model.state_dict().items():
        assert torch.equal(p, run.model.state_dict()[name].to(torch.bfloat16)), name
    samples = [s for s in run.samples() if s.trajectories[0].param_version == 1]
    assert samples
    rows = [
        (s.prompt_ids, t.response_ids, t.response_logprobs, 0.0)
        for s in samples
        for t in s.trajectories
    ]
    errors = rollout_logprob_errors(
        run.model, rows, 0, run.cfg.actor_rollout_ref.rollout.temperature
    )
    assert 1e-4 < float(errors.max()) < 0.5


def test_a_mode_d_sync_logs_partials_and_continues_them_as_a_new_segment(tmp_path):
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", STEPPED)
    run = Run(cfg)
    # The sync is requested during the first decoding step, so every trajectory in flight is
    # cut short after its first token.
    run.before_decoding_step(1, run.sync_new_weights)
    run.when_published(4, run.trainer.finish)
    run.run()

    kinds = _kinds(run.events())
    _assert_paused_sync(kinds, 1)
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    partials = run.partials()
    assert paused.n_partial == len(partials) == 4  # all four samples in flight were logged
    assert paused.produced == 0
    # Each partial holds the tokens so far (one) of every interrupted trajectory, version 0.
    for p in partials:
        assert p.interrupted_at_version == 0
        for t in p.sample.trajectories:
            assert t.finish_reason == "abort" and len(t.response_ids) == 1
            assert t.segment_versions == [0]
    # Continued under version 1: the first token is version 0's, the rest a new segment.
    by_id = {s.sample_id: s for s in run.samples()}
    for p in partials:
        sample = by_id[p.sample.sample_id]
        for logged, t in zip(p.sample.trajectories, sample.trajectories, strict=True):
            assert t.response_ids[:1].tolist() == logged.response_ids.tolist()
            assert t.response_logprobs[:1].tolist() == logged.response_logprobs.tolist()
            if len(t.response_ids) > 1:
                assert (t.segment_starts, t.segment_versions) == ([0, 1], [0, 1])
            assert t.param_version_start == 0
    resumed = [e for e in run.events() if isinstance(e, ev.RolloutResumed)]
    assert resumed[1].num_stale == 4  # the four continued samples, in flight at the sync
    assert resumed[1].budget == cfg.max_samples_per_version - 4


def test_a_restarted_worker_skips_published_prompts_and_continues_logged_partials(tmp_path):
    cfg = _cfg(tmp_path, "actor_rollout_ref.rollout.n=2", "async_training.partial_rollout=true")
    run = Run(cfg, prompts=5)
    ids = [p.sample_id for p in run.broker.read(cfg, "prompts", decode_prompt)]
    # The previous incarnation published samples 0 and 2 (their offsets were not committed)
    # and logged sample 3 with one trajectory finished and one cut short after two tokens.
    pub = run.broker.publisher()
    for sid in (ids[0], ids[2]):
        pub.publish(cfg.topic("samples"), sid, encode_sample(_logged(sid, "stop")), _HEADERS)
    logged = _logged(ids[3], "abort")
    logged.trajectories[0].finish_reason = "stop"
    pub.publish(
        cfg.topic("partials"), ids[3], encode_partial(PartialSample(logged, 0, 0, 3)), _PARTIAL
    )
    run.when_published(2 + 3, run.trainer.finish)
    run.run()

    published = [s.sample_id for s in run.samples()]
    assert sorted(published[2:]) == sorted([ids[1], ids[3], ids[4]])  # each exactly once
    assert run.worker.admission.recovery.skipped == 2 and run.worker.admission.recovery.resumed == 1
    assert run.worker.budget.started == 3 - 1  # skipped prompts cost none; its own partial none
    continued = next(s for s in run.samples()[2:] if s.sample_id == ids[3])
    done, cut = continued.trajectories
    assert done.response_ids.tolist() == logged.trajectories[0].response_ids.tolist()  # kept
    assert cut.response_ids[:2].tolist() == logged.trajectories[1].response_ids.tolist()
    # Logged and continued under the same version 0: its tokens go on in one segment (a
    # second segment of the same version is invalid: the sample did not encode, and the
    # worker failed on it).
    assert (cut.segment_starts, cut.segment_versions) == ([0], [0])
    assert run.broker.committed[(cfg.topic("prompts"), 0)] == 5  # every prompt accounted for


def test_a_revoked_partition_hands_its_samples_back_logged_and_refunded(tmp_path):
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", STEPPED)
    run = Run(cfg, prompts=8)
    broker, worker = run.broker, run.worker

    def revoke():  # after one token of each trajectory, the partition moves away
        remaining = worker.budget.remaining
        run.sources[0].revoke()
        assert worker.budget.remaining == remaining + 4  # the four samples' budget refunded
        assert len(worker.in_flight) == 0 and not worker.runner.busy
        run.trainer.finish()

    run.before_decoding_step(2, revoke)
    run.run()
    partials = broker.read(cfg, "partials", decode_partial)
    assert len(partials) == 4 and not broker.topics.get(cfg.topic("samples"))
    assert all(len(t.response_ids) == 1 for p in partials for t in p.sample.trajectories)
    stopped = [e for e in broker.events(cfg) if isinstance(e, ev.WorkerStopped)]
    dropped = [e for e in broker.events(cfg) if isinstance(e, ev.SamplesDropped)]
    assert stopped[0].reason == "run finished" and not dropped  # nothing left in flight


def _after_admission(run: Run, k: int, action, steps: int = 0) -> None:
    """``action`` (on the worker's loop) once the k-th sample has started and, after that,
    the engine's thread has made ``steps`` decoding steps: with steps >= 2 the sample's
    requests have a token at least (the first step may have begun before they were added)."""
    admit, started = run.worker.admission.admit, [0]
    stepwise = run.worker.engine.engine
    step, runner_step, since = stepwise.step, run.worker.runner.step, [-1]

    def counted_admit(*args):
        took = admit(*args)
        started[0] += took
        if took and started[0] == k:
            since[0] = 0
        return took

    def counted_step():
        if since[0] >= 0:
            since[0] += 1
        return step()

    def act_when_due(timeout: float = 0.0):
        if since[0] >= steps:
            since[0] = -(10**9)  # once
            action()
        return runner_step(timeout)

    run.worker.admission.admit = counted_admit
    stepwise.step = counted_step
    run.worker.runner.step = act_when_due


def _honest_segments(t: Trajectory) -> bool:
    """Every segment holds a token (a trajectory's version is its last token's)."""
    ends = [*t.segment_starts[1:], len(t.response_ids)]
    nonempty = all(a < b for a, b in zip(t.segment_starts, ends, strict=True))
    return nonempty or len(t.segment_starts) == 1


SLOW_STEPS = "actor_rollout_ref.rollout.emulated_decode_latency_s=0.02"


def test_a_mode_d_sync_aborts_the_engine_threads_requests_and_continues_them(tmp_path):
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", SLOW_STEPS)
    run = Run(cfg)
    _after_admission(run, 5, run.sync_new_weights)  # the first admitted after a sample
    # Versions 0 and 1 admit 6 samples in all (v1's budget is 6 minus those of v0 that
    # were in flight or not consumed at the sync): the last one ends the run.
    run.when_published(6, run.trainer.finish)
    run.run()

    kinds = _kinds(run.events())
    _assert_paused_sync(kinds, 1)
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    partials = run.partials()
    assert paused.n_partial == len(partials) >= 1
    # Each sample goes on from exactly the tokens its partial logged; an interrupted
    # trajectory's next tokens are a segment of version 1.
    by_id = {s.sample_id: s for s in run.samples()}
    cut = 0
    for p in partials:
        sample = by_id[p.sample.sample_id]
        for logged, t in zip(p.sample.trajectories, sample.trajectories, strict=True):
            n = len(logged.response_ids)
            assert t.response_ids[:n].tolist() == logged.response_ids.tolist()
            assert t.response_logprobs[:n].tolist() == logged.response_logprobs.tolist()
            if logged.finish_reason == "abort" and len(t.response_ids) > n:
                segments = ([0], [1]) if n == 0 else ([0, n], [0, 1])
                assert (t.segment_starts, t.segment_versions) == segments
                cut += 1
            elif logged.finish_reason != "abort":
                assert t == logged  # finished before the sync: published as it was logged
    assert cut >= 1
    # A request that finished before the abort reached the engine's thread came back whole
    # and was finished, not continued: it is its version's, with no empty segment.
    assert all(_honest_segments(t) for s in run.samples() for t in s.trajectories)
    assert _same_weights(run.worker.engine.model, run.model)


def test_an_in_flight_update_swaps_the_engine_threads_weights_between_two_tokens(tmp_path):
    cfg = _cfg(
        tmp_path,
        "async_training.partial_rollout=true",
        "async_training.in_flight_update=true",
        SLOW_STEPS,
    )
    run = Run(cfg)
    synced = threading.Event()

    def sync() -> None:
        run.sync_new_weights()
        synced.set()

    _after_admission(run, 5, sync, steps=2)
    # The engine's thread makes no step from the sync until the swap is handed to it: the
    # weights arrive in the background, and on a loaded machine the 5th sample's short
    # responses (2-4 tokens at 20 ms) had ended before they did ("no trajectory was
    # generated across the swap", now and then).
    background = run.worker.engine
    step, held = background.engine.step, [False]

    def step_after_the_swap():
        if synced.is_set() and not held[0]:
            deadline = time.monotonic() + 10
            while run.worker.version < 1 and not background._calls:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            held[0] = True
            if background._calls:
                return []  # no step: the swap comes first, then the next token
        return step()

    background.engine.step = step_after_the_swap
    # Versions 0 and 1 admit 6 samples in all (v1's budget is 6 minus those of v0 that
    # were in flight or not consumed at the sync): the last one ends the run.
    run.when_published(6, run.trainer.finish)
    run.run()

    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    assert paused.n_partial == 0 and not run.partials()
    assert _same_weights(run.worker.engine.model, run.model)
    spanning = [t for s in run.samples() for t in s.trajectories if t.segment_versions == [0, 1]]
    assert spanning, "no trajectory was generated across the swap"
    assert all(_honest_segments(t) for s in run.samples() for t in s.trajectories)


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_cpu_worker_verifies_a_gpu_trainers_checksums_in_their_format(tmp_path, in_flight):
    """A trainer on a GPU publishes ``wsum64:`` checksums (computed on the device); a worker
    on a CPU, which would hash with sha256, verifies each version in the trainer's format,
    at a join, after a paused sync and after an in-flight swap (whose weights were hashed on
    arrival, before their announcement)."""
    modes = ["async_training.partial_rollout=true", "async_training.in_flight_update=true"]
    cfg = _cfg(tmp_path, *(modes if in_flight else []), STEPPED)
    run = Run(cfg)
    run.trainer.checksum_like = "wsum64:"

    def sync_and_receive() -> None:
        run.sync_new_weights()
        if in_flight:
            shadow = run.worker.shadow
            assert shadow is not None and shadow.ready.wait(10)

    def second_sync() -> None:
        run.trainer.consumed = {"0": 4}
        sync_and_receive()

    run.before_decoding_step(2, sync_and_receive)
    run.when_published(6, second_sync)
    run.when_published(9, run.trainer.finish)
    run.run()
    published = [e for e in run.broker.events(cfg) if isinstance(e, ev.WeightsPublished)]
    loaded = [e for e in run.events() if isinstance(e, ev.WeightsLoaded)]
    assert all(e.checksum.startswith("wsum64:") for e in published)
    assert [e.version for e in loaded] == [0, 1, 2]
    assert all(e.checksum_ok for e in loaded)
    assert _same_weights(run.worker.engine.model, run.model)


# --- the log a previous incarnation left ------------------------------------------------------
_HEADERS = {SCHEMA_HEADER: SAMPLE_TAG, WORKER_HEADER: "0"}
_PARTIAL = {SCHEMA_HEADER: PARTIAL_TAG}


def _logged(sample_id: str, finish: str) -> Sample:
    trajs = [Trajectory([4, 5], [-0.5, -0.4], 0.0, finish_reason=finish) for _ in range(2)]
    return Sample(sample_id, sample_id.split("@")[0], 0, [1, 5, 14, 6, 17], "11", trajs)


@pytest.mark.parametrize("engine", ["hf", "hf_cached", "hf_static"])
def test_an_in_flight_update_swaps_weights_between_two_tokens_without_a_pause(tmp_path, engine):
    cfg = _cfg(
        tmp_path,
        "async_training.partial_rollout=true",
        "async_training.in_flight_update=true",
        f"actor_rollout_ref.rollout.name={engine}",
        STEPPED,
    )
    run = Run(cfg)
    old = {k: v.clone() for k, v in run.model.state_dict().items()}
    told = []  # the engine hears of every load: the join's and the swap's
    changed = run.worker.engine.weights_changed
    run.worker.engine.weights_changed = lambda: told.append(changed())  # type: ignore[method-assign]

    def sync_and_receive() -> None:
        """The sync, and its weights in the shadow before the next decoding step (its thread
        takes them from the local transport at its own pace: the samples could all finish
        first, and nothing would span the swap)."""
        run.sync_new_weights()
        shadow = run.worker.shadow
        assert shadow is not None and shadow.ready.wait(10)

    run.before_decoding_step(2, sync_and_receive)  # after the first token of each trajectory
    run.when_published(4, run.trainer.finish)
    run.run()

    kinds = _kinds(run.broker.events(cfg))
    at = kinds.index("SyncRequested(1)")
    # The trainer sends at once (nobody pauses); the worker swaps once both the weights and
    # their announcement are in, and publishes the hand-shake's events for the record.
    assert kinds[at : at + 5] == [
        "SyncRequested(1)",
        "WeightsPublished(1)",
        "RolloutPaused(1)",
        "WeightsLoaded(1)",
        "RolloutResumed(1)",
    ]
    events = run.events()
    paused = next(e for e in events if isinstance(e, ev.RolloutPaused))
    loaded = [e for e in events if isinstance(e, ev.WeightsLoaded)]
    assert paused.n_partial == 0 and not run.partials()  # nothing interrupted on the log
    assert all(e.checksum_ok for e in loaded)
    assert _same_weights(run.worker.engine.model, run.model)
    # The samples in flight went on under version 1 as a second segment: the tokens before
    # the swap are version 0's, the rest version 1's, the logprobs each version's own.
    samples = run.samples()
    spanning = [t for s in samples for t in s.trajectories if t.segment_versions == [0, 1]]
    assert spanning, "no trajectory was generated across the swap"
    for t in spanning:
        assert t.segment_starts[1] >= 1 and t.param_version_start == 0 and t.param_version == 1
    resumed = [e for e in events if isinstance(e, ev.RolloutResumed)]
    assert resumed[1].num_stale == 4  # the four samples in flight at the swap
    assert len(told) == len(loaded) == 2
    weights = {0: old, 1: run.model.state_dict()}
    for s in samples:  # each token's logprob is the one its version's weights give it
        for t in s.trajectories:
            ends = [*t.segment_starts[1:], len(t.response_ids)]
            for start, end, v in zip(t.segment_starts, ends, t.segment_versions, strict=True):
                errors = token_logprob_errors(cfg, weights[v], s.prompt_ids, t)[start:end]
                assert max(errors, default=0.0) < 1e-4, (v, errors)


def test_worker_0_evaluates_the_weights_of_each_test_freq_step_when_the_trainer_does_not(
    tmp_path,
):
    cfg = _cfg(tmp_path, "async_training.use_trainer_do_validate=false", "trainer.test_freq=5")
    run = Run(cfg)

    def sync(step: int):
        def request() -> None:  # the trainer has consumed every sample so far
            run.trainer.step = step
            run.trainer.consumed = {"0": len(run.broker.topics[cfg.topic("samples")])}
            run.trainer.request_sync()

        return request

    run.when_published(2, sync(4))  # not a multiple of test_freq: no evaluation
    run.when_published(8, sync(5))
    run.when_published(14, run.trainer.finish)
    run.run()

    validated = [e for e in run.broker.events(cfg) if isinstance(e, ev.Validated)]
    assert [(e.version, e.step) for e in validated] == [(0, 0), (2, 5)]
    assert all(0.0 <= e.accuracy <= 1.0 and e.eval_s > 0 for e in validated)
    assert validated[0].worker == 0 and validated[0].tool_use == -1.0


def test_a_sync_cadence_that_does_not_divide_test_freq_skips_no_evaluation(tmp_path):
    """A sync every 4 steps (the shipped configs) and test_freq 5: the weights of step 8 are
    the first past step 5, so worker 0 evaluates them (and not again until past step 10)."""
    cfg = _cfg(tmp_path, "async_training.use_trainer_do_validate=false", "trainer.test_freq=5")
    run = Run(cfg)

    def sync(step: int):
        def request() -> None:
            run.trainer.step = step
            run.trainer.consumed = {"0": len(run.broker.topics[cfg.topic("samples")])}
            run.trainer.request_sync()

        return request

    run.when_published(2, sync(4))
    run.when_published(8, sync(8))
    run.when_published(12, sync(9))  # still in the 5-9 window: evaluated already
    run.when_published(16, run.trainer.finish)
    run.run()

    validated = [e for e in run.broker.events(cfg) if isinstance(e, ev.Validated)]
    assert [(e.version, e.step) for e in validated] == [(0, 0), (2, 8)]


def test_a_group_without_signal_gives_its_budget_slot_back_as_it_is_published(tmp_path):
    """Dynamic sampling: the trainer will leave out a group whose answers all score the same,
    so its worker takes the slot back at once. Before, the slot came back only with the
    trainer's SamplesDropped (51 ms after the group's last token at the median on the demo);
    with no trainer to send one, a worker at staleness 0 stopped after its 4 samples, filtered
    ones included."""
    import threading
    import time

    from asyncrl.consumers.dynamic_sampling import no_signal
    from asyncrl.schemas.sample import NO_SIGNAL_HEADER

    cfg = _cfg(
        tmp_path,
        "algorithm.filter_groups.enable=true",
        "async_training.staleness_threshold=0",
        parity_reward(tmp_path),
    )
    run = Run(cfg, prompts=64)
    budget = cfg.max_samples_per_version
    topic = cfg.topic("samples")
    worker = run.worker

    def finish_once_idle() -> None:  # the budget spent and nothing in flight: all it may make
        # Idle for 0.2 s, not at one look: between a flat group leaving the worker's in-flight
        # samples and its slot coming back, the worker looks idle too (CI ended a run there,
        # one kept group short).
        deadline, idle_looks = time.monotonic() + 60, 0
        while time.monotonic() < deadline and idle_looks < 4:
            time.sleep(0.05)
            published = run.broker.topics.get(topic)
            idle = published and not len(worker.in_flight) and worker.budget.remaining == 0
            idle_looks = idle_looks + 1 if idle else 0
        run.trainer.finish()

    watcher = threading.Thread(target=finish_once_idle, daemon=True)
    watcher.start()
    run.run()
    watcher.join(5)

    records = run.broker.topics[topic]
    samples = run.samples()
    flagged = [NO_SIGNAL_HEADER in r.headers for r in records]
    fg = cfg.algorithm.filter_groups
    assert flagged == [no_signal(s, fg) is not None for s in samples]
    assert any(flagged), "the 100-step warm start answers some groups all wrong"
    assert flagged.count(False) == budget  # every slot not taken back made a kept group
    assert worker.no_signal == flagged.count(True) and worker.produced == len(records)


def test_a_worker_out_of_budget_says_so_apart_from_its_other_idle_time(tmp_path):
    """RolloutResumed.budget_idle_ratio: of the window's idle time, the part with the
    version's budget spent, which a higher staleness_threshold would have filled (the
    report and bench learn show it next to the idle ratio)."""
    cfg = _cfg(tmp_path, "async_training.staleness_threshold=0")
    held = 0.5
    first, second = _resumed_around_a_spent_version(Run(cfg, prompts=32), held)
    assert first.version == 0 and second.version == 1
    window = second.ts - first.ts
    assert second.budget_idle_ratio * window >= 0.8 * held
    assert second.budget_idle_ratio <= second.idle_ratio + 1e-3  # two clocks, a µs apart


def test_a_worker_says_how_full_its_engine_ran_and_what_the_budget_left_empty(tmp_path):
    """RolloutResumed.engine_occupancy and budget_unfilled_ratio: a version's samples all
    start at once, their short responses end, and the long ones decode alone while the
    budget is spent (the drain that idle_ratio does not see: the worker is busy). The
    engine's empty share then counts as the budget's, whole once the worker is idle too; the
    start-up window before the first budget is not measured (-1)."""
    cfg = _cfg(
        tmp_path,
        "async_training.staleness_threshold=0",
        "actor_rollout_ref.rollout.name=sim",
        "sim.capacity=16",  # the version's 4 samples x n=4 fill the engine exactly
        "sim.decode_step_s=0.01",
        "sim.long_tail_fraction=0.25",
        "sim.short_mean_fraction=0.1",
        "data.max_response_length=32",
    )
    run = Run(cfg, prompts=32)
    assert run.worker.full_batch == 16
    # held out of budget and idle 0.2 s: the engine empty, all of it the budget's
    gc.disable()  # a collection of the (by then large) suite process mid-window is no budget
    try:
        first, second = _resumed_around_a_spent_version(run, 0.2)
    finally:
        gc.enable()
    assert (first.engine_occupancy, first.budget_unfilled_ratio) == (-1.0, -1.0)
    assert 0.0 < second.engine_occupancy < 0.9, "the long responses decoded alone a while"
    # The budget was spent from the first admission on: what the engine left empty is the
    # budget's, but for the few ms before the worker admitted its samples and the sync
    # (~20 ms here, from the request to the new budget: its weights come at once).
    window = second.ts - first.ts
    requested = next(e for e in run.events() if isinstance(e, ev.SyncRequested))
    syncing = second.ts - requested.ts
    not_budget = 1 - second.engine_occupancy - second.budget_unfilled_ratio
    assert 0 <= not_budget * window < 0.1 + syncing
    assert second.budget_unfilled_ratio >= second.budget_idle_ratio - 1e-3
    assert second.budget_unfilled_ratio > second.budget_idle_ratio + 0.05, "busy, not idle"


def test_a_sync_pause_is_idle_time_but_not_the_budgets(tmp_path):
    """From the pause to the new weights the worker waits for the sync, whatever its budget:
    that time is idle (rollouter/idle_ratio), and neither budget figure counts it. Here the
    trainer takes 0.4 s to send the weights after the pause."""
    import time

    cfg = _cfg(tmp_path, "async_training.staleness_threshold=0")
    run = Run(cfg, prompts=32)
    send, held = run.trainer._send, 0.4

    def slow_send(workers, members=None):
        if run.trainer.version > 0:  # a sync's weights, not a join's
            time.sleep(held)
        send(workers, members)

    run.trainer._send = slow_send
    first, second = _resumed_around_a_spent_version(run, 0.0)
    window = second.ts - first.ts
    # (The worker may also wait out of budget before the sync begins: that part is the
    # budget's, so each figure's share outside the budget is what must hold the pause.)
    assert second.idle_ratio * window >= 0.9 * held
    assert (second.idle_ratio - second.budget_idle_ratio) * window >= 0.9 * held
    empty = 1 - second.engine_occupancy
    assert (empty - second.budget_unfilled_ratio) * window >= 0.9 * held


def _resumed_around_a_spent_version(run: Run, held: float) -> list[ev.RolloutResumed]:
    """Run the worker; once it has produced its version's budget and has nothing in flight,
    hold it there ``held`` seconds, then sync; finish two samples into the next version.
    Returns the RolloutResumed of the start and of that sync."""
    import threading
    import time

    worker = run.worker

    def sync_after_holding_the_spent_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.01)
            if worker.produced and not len(worker.in_flight) and not worker.budget.remaining:
                break
        time.sleep(held)  # out of budget, nothing else to wait for
        run.trainer.consumed = {"0": worker.produced}
        run.sync_new_weights()

    watcher = threading.Thread(target=sync_after_holding_the_spent_worker, daemon=True)
    watcher.start()
    run.when_published(run.cfg.max_samples_per_version + 2, run.trainer.finish)
    run.run()
    watcher.join(5)
    return [e for e in run.events() if isinstance(e, ev.RolloutResumed)][:2]


def _sync_once_a_result_waits(run: Run, action) -> list[str]:
    """``action`` (a sync) on the worker's loop the first time a request has finished on the
    engine's thread (EOS, or its length) and waits to be collected; that turn of the loop
    collects nothing, so the sync's abort is what meets the finished request, as it does
    when a request ends on the very token the abort lands on. Returns that request's id."""
    engine, runner_step, hit = run.worker.engine, run.worker.runner.step, []

    def step(timeout: float = 0.0):
        if not hit:
            with engine._cv:  # the wait collect would make, taking nothing
                engine._cv.wait_for(lambda: engine._finished, timeout)
                ended = [r.request_id for r in engine._finished.values()]
            if ended:
                hit.append(ended[0])
                action()
                return []
        return runner_step(timeout)

    run.worker.runner.step = step
    return hit


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_trajectory_that_ended_as_the_sync_aborted_it_is_published_finished(tmp_path, in_flight):
    """A sync's abort that meets a request which has just ended (its last token EOS, or the
    length limit) gets it back whole: the trajectory is finished under the version that
    generated it, not interrupted. Before, it was logged to ``partials`` as cut short
    (``finish_reason="abort"``, its tokens ending in EOS), counted in ``n_partial`` and
    continued under the next version as a segment with no token."""
    modes = ["async_training.partial_rollout=true"]
    modes += ["async_training.in_flight_update=true"] if in_flight else []
    cfg = _cfg(tmp_path, *modes, SLOW_STEPS)
    run = Run(cfg)

    def sync() -> None:
        run.sync_new_weights()
        if in_flight:  # the swap comes at the loop's next turn, before it collects
            shadow = run.worker.shadow
            assert shadow is not None and shadow.ready.wait(10)

    hit = _sync_once_a_result_waits(run, sync)
    run.when_published(6, run.trainer.finish)
    run.run()

    assert hit, "no request finished on the engine's thread before the run ended"
    sample_id, _, index = hit[0].rpartition("#")
    eos = set(run.worker.engine.engine.eos_token_ids)
    for p in run.partials():
        for t in p.sample.trajectories:
            if t.finish_reason == "abort":  # cut short: it had not ended
                assert not (len(t.response_ids) and int(t.response_ids[-1]) in eos)
                assert len(t.response_ids) < cfg.data.max_response_length
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    assert paused.n_partial == len(run.partials())
    published = {s.sample_id: s for s in run.samples()}
    t = published[sample_id].trajectories[int(index)]
    assert t.finish_reason in ("stop", "length")
    assert (t.segment_starts, t.segment_versions) == ([0], [0])
    assert t.param_version == t.param_version_start == 0
    ids = t.response_ids.tolist()
    ends = [i for i, tok in enumerate(ids) if tok in eos]
    assert ends in ([], [len(ids) - 1]), "tokens after EOS"
    # The sample was published as it finished, not after the sync: unless another of its
    # trajectories was cut short, it is among the samples the pause counted.
    logged = {p.sample.sample_id for p in run.partials()}
    if sample_id not in logged and not in_flight:
        order = [s.sample_id for s in run.samples()]
        assert order.index(sample_id) < paused.produced
    assert all(_honest_segments(t) for s in run.samples() for t in s.trajectories)


# --- a slow custom reward, scored off the loop ------------------------------------------------
SLOW_REWARD = """
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, calls=""):
    t0 = time.time()
    time.sleep(0.2)
    with open(calls, "a") as f:
        f.write(f"{t0} {time.time()}\\n")
    return 1.0
"""


def _slow_reward(tmp_path) -> tuple[list[str], object]:
    """Overrides for a custom reward taking 0.2 s a call, which logs each call's start and
    end to the returned file."""
    path, calls = tmp_path / "slow_reward.py", tmp_path / "calls.txt"
    path.write_text(SLOW_REWARD)
    return [
        f"custom_reward_function.path={path}",
        f"custom_reward_function.reward_kwargs.calls={calls}",
    ], calls


def _decoding_times(run: Run) -> list[float]:
    """When each of the worker's decoding steps began (steps with sequences to decode)."""
    step, times = run.worker.runner.step, []

    def timed(timeout: float = 0.0):
        if run.worker.engine.num_active:
            times.append(time.time())
        return step(timeout)

    run.worker.runner.step = timed
    return times


def test_a_slow_custom_reward_does_not_stall_decoding(tmp_path):
    """The reward calls run beside the loop: the worker decodes the samples it admitted next
    while the first ones are scored (inline, every call stopped the loop for its 0.2 s)."""
    reward, calls = _slow_reward(tmp_path)
    run = Run(_cfg(tmp_path, STEPPED, *reward))
    times = _decoding_times(run)
    run.when_published(6, run.trainer.finish)  # version 0's budget
    assert run.run() == 6
    spans = [tuple(map(float, line.split())) for line in calls.read_text().splitlines()]
    assert len(spans) == 6 * 4
    during = [t for t in times if any(a < t < b for a, b in spans)]
    assert during, "no decoding step ran while a reward was being computed"
    samples = run.samples()
    assert len({s.sample_id for s in samples}) == 6
    for t in (t for s in samples for t in s.trajectories):
        assert t.reward == 1.0 and not t.reward_error and t.reward_s >= 0.2


def _scoring_at_pause(run: Run) -> list[dict[str, tuple[int, int]]]:
    """Filled as the worker publishes RolloutPaused: per sample in flight then, (trajectories
    being scored, trajectories cut short)."""
    paused, seen = run.worker.follower.paused, []

    def recorded(*args, **kwargs):
        flights = run.worker.in_flight.samples.items()
        seen.append({s: (fl.scoring, len(fl.interrupted)) for s, fl in flights})
        return paused(*args, **kwargs)

    run.worker.follower.paused = recorded
    return seen


def _finish_once_scored_after_the_pause(run: Run, at_pause: list) -> None:
    """The trainer finishes the run once the samples being scored at the pause are published,
    and one sample of the next version (the first published after the pause when none was)."""

    finished: list[bool] = []

    def react(rec) -> None:
        if rec.topic != run.cfg.topic("samples") or not at_pause or finished:
            return
        held = {s for s, (scoring, _) in at_pause[0].items() if scoring}
        paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
        published = {s.sample_id for s in run.samples()}
        if held <= published and len(published) > paused.produced + len(held):
            finished.append(True)
            run.trainer.finish()

    run.broker.reactions.append(react)


def _held_through_the_sync(run: Run, at_pause: list) -> list[str]:
    """The samples being scored at the pause: each has every trajectory finished (none cut
    short), is published after the pause, once, whole and scored, under version 0 only."""
    held = [s for s, (scoring, _) in at_pause[0].items() if scoring]
    assert all(at_pause[0][s][1] == 0 for s in held)
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    samples = run.samples()
    assert len({s.sample_id for s in samples}) == len(samples)
    before = {s.sample_id for s in samples[: paused.produced]}
    after = {s.sample_id: s for s in samples[paused.produced :]}
    assert not before & set(held) and set(held) <= set(after)
    for t in (t for s in held for t in after[s].trajectories):
        assert t.segment_versions == [0] and t.reward == 1.0 and not t.reward_error
    return held


def test_a_mode_c_pause_waits_for_decoding_not_for_rewards(tmp_path):
    """A sync requested while finished trajectories are being scored: the worker pauses as
    soon as nothing decodes; the samples only being scored are scored through the weight
    transfer and published after it, under version 0, and version 1's budget counts them in
    flight (num_stale). Before, the pause waited for every score (none pending at it)."""
    reward, _ = _slow_reward(tmp_path)
    cfg = _cfg(tmp_path, STEPPED, *reward)
    run = Run(cfg)
    worker, step, requested = run.worker, run.worker.runner.step, []

    def sync_while_scoring(timeout: float = 0.0):
        if not requested and worker.score.pending and worker.engine.num_active:
            requested.append(len(worker.in_flight))
            run.trainer.consumed = {"0": 2}
            run.sync_new_weights()
        return step(timeout)

    worker.runner.step = sync_while_scoring
    at_pause = _scoring_at_pause(run)
    _finish_once_scored_after_the_pause(run, at_pause)
    run.run()

    assert requested and at_pause, "no sync came while a reward was pending"
    events = run.events()
    _assert_paused_sync(_kinds(events), 1)
    paused = next(e for e in events if isinstance(e, ev.RolloutPaused))
    resumed = [e for e in events if isinstance(e, ev.RolloutResumed)]
    held = _held_through_the_sync(run, at_pause)
    assert held, "the pause waited for the scores"
    assert paused.n_partial == 0 and not run.partials()
    assert paused.in_flight_finished == len(held)  # the event says so (it was always 0)
    # Every sample started under version 0 was published before the pause or held; each
    # held one is stale for version 1 exactly as a published, unconsumed one is.
    v0 = [s for s in run.samples() if s.trajectories[0].param_version == 0]
    assert len(v0) == paused.produced + len(held) == len(at_pause[0]) + paused.produced
    assert resumed[1].num_stale == max(0, paused.produced - 2) + len(held)
    assert resumed[1].budget == cfg.max_samples_per_version - resumed[1].num_stale
    assert all(s.trajectories[0].param_version == 1 for s in run.samples()[len(v0) :])


HELD_REWARD = """
import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, hold=""):
    time.sleep(0.2)
    while os.path.exists(os.path.join(hold, str(ground_truth))):  # the test holds it back
        time.sleep(0.01)
    return 1.0
"""


class HeldSample:
    """A reward of 0.2 s a call whose results the test can hold back for one sample, and a
    sync (``action``) on the worker's loop as the last trajectory of a sample finishes while
    others decode: that sample is then only being scored, and its scores are held back
    until ``release`` (it is picked with a ground truth no other prompt has, so nothing
    else waits; its calls hold reward processes, so there are 2n). ``at_sync``: (samples in
    flight, samples published) then."""

    def __init__(self, tmp_path) -> None:
        self.dir = tmp_path / "hold"
        self.dir.mkdir()
        path = tmp_path / "held_reward.py"
        path.write_text(HELD_REWARD)
        self.overrides = [
            f"custom_reward_function.path={path}",
            f"custom_reward_function.reward_kwargs.hold={self.dir}",
            # a held call keeps its process: n of them busy, n others score the rest
            "custom_reward_function.num_workers=8",
        ]
        self.at_sync: list[tuple[int, int]] = []
        self.sample_id = ""
        self.truth = ""

    def arm(self, run: Run, action) -> None:
        worker = run.worker
        truths = [str(p.ground_truth) for p in run.broker.read(run.cfg, "prompts", decode_prompt)]
        n, on_finished = run.cfg.actor_rollout_ref.rollout.n, worker._on_finished

        def finished(request_id: str, state) -> None:
            on_finished(request_id, state)
            sample_id = request_id.rpartition("#")[0]
            fl = worker.in_flight.samples.get(sample_id)
            only_scored = fl is not None and fl.scoring and len(fl.done) + fl.scoring == n
            if self.at_sync or not only_scored or not worker.runner.busy:
                return
            truth = str(fl.prompt.value.ground_truth)
            if truths.count(truth) == 1:
                (self.dir / truth).touch()
                self.sample_id, self.truth = sample_id, truth
                self.at_sync.append((len(worker.in_flight), worker.produced))
                action()

        worker._on_finished = finished

    def release(self) -> None:
        (self.dir / self.truth).unlink(missing_ok=True)


def test_a_mode_d_sync_with_rewards_pending_loses_nothing(tmp_path):
    """A sync arrives while a sample with every trajectory finished is being scored and others
    decode: the worker cuts the decoding ones, waits only for the scores of the samples it
    logs to ``partials`` (their records carry the rewards), and pauses; the sample only being
    scored is published after the transfer under version 0. Each prompt ends as exactly one
    sample."""
    held_back = HeldSample(tmp_path)
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", STEPPED, *held_back.overrides)
    run = Run(cfg)
    held_back.arm(run, run.sync_new_weights)
    at_pause = _scoring_at_pause(run)
    paused = run.worker.follower.paused

    def release_after_the_pause(*args, **kwargs):
        paused(*args, **kwargs)
        held_back.release()

    run.worker.follower.paused = release_after_the_pause
    _finish_once_scored_after_the_pause(run, at_pause)
    run.run()

    assert held_back.at_sync and at_pause, "no sync came while a sample was only being scored"
    in_flight, produced = held_back.at_sync[0]
    scoring, _ = at_pause[0].get(held_back.sample_id, (0, 0))
    assert scoring, "the pause waited for the scores of a sample only being scored"
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    partials, samples = run.partials(), run.samples()
    held = _held_through_the_sync(run, at_pause)
    assert held, "the pause waited for the scores"
    # Every sample in flight at the sync was published before the pause (completed by a
    # trajectory the abort found ended), logged with its finished trajectories scored, or
    # held, being scored; none is two of these.
    logged = {p.sample.sample_id for p in partials}
    assert paused.n_partial == len(partials) == len(logged) > 0
    assert paused.in_flight_finished == len(held)  # the event says so (it was always 0)
    assert paused.produced - produced + paused.n_partial + len(held) == in_flight
    assert not logged & set(held)
    assert all(at_pause[0][s][0] == 0 for s in logged)  # their scores came first
    for p in partials:
        for t in p.sample.trajectories:
            if t.finish_reason != "abort":  # finished, scored before it was logged
                assert t.reward == 1.0 and t.segment_versions == [0]
    by_id = {s.sample_id: s for s in samples}
    for s in samples[: paused.produced]:  # published before the pause, all under version 0
        assert all(t.segment_versions == [0] for t in s.trajectories)
    for p in partials:
        continued = by_id[p.sample.sample_id].trajectories
        for logged_t, t in zip(p.sample.trajectories, continued, strict=True):
            if logged_t.finish_reason != "abort":
                assert t.response_ids.tolist() == logged_t.response_ids.tolist()
                assert t.segment_versions == [0]
    for t in (t for s in samples for t in s.trajectories):
        assert t.reward == 1.0 and not t.reward_error
    assert len(by_id) == len(samples)


@pytest.mark.parametrize("filters", [False, True])
def test_a_backlog_outliving_a_version_waits_at_the_next_pause_only_with_dynamic_sampling(
    tmp_path, filters
):
    """Two syncs, the second before the worker decodes again after the first, while the scores
    of a sample held through the first (only being scored) are held back: with dynamic sampling
    the second pause waits for them, so the sample is published under version 1 at the
    latest (its no-signal slot comes back under a version ``asyncrl audit`` allows);
    without, it is held again and published after, still under version 0's tokens."""
    held_back = HeldSample(tmp_path)
    extra = ["algorithm.filter_groups.enable=true"] if filters else []
    modes = ["async_training.partial_rollout=true", STEPPED, *extra]
    cfg = _cfg(tmp_path, *modes, *held_back.overrides)
    run = Run(cfg)
    worker, step = run.worker, run.worker.runner.step
    run.trainer.consumed = {"0": 100}  # the trainer is ahead: the budgets count what is in flight
    held_back.arm(run, run.sync_new_weights)
    opener = threading.Timer(1.0, held_back.release)

    def again_before_decoding(timeout: float = 0.0):
        trainer = run.trainer
        if trainer.version == 1 and trainer.requested is None:
            run.sync_new_weights()  # no trajectory has finished since the first
            opener.start()  # 1 s on: the pause has come, or waits for the held-back scores
        if trainer.requested == 2:
            return []  # nothing decodes until it pauses
        return step(timeout)

    worker.runner.step = again_before_decoding
    at_pause = _scoring_at_pause(run)
    finished: list[bool] = []

    def finish_once_both_backlogs_are_published(rec) -> None:
        if rec.topic != cfg.topic("samples") or len(at_pause) < 2 or finished:
            return
        held = {s for p in at_pause for s, (scoring, _) in p.items() if scoring}
        if held <= {s.sample_id for s in run.samples()}:
            finished.append(True)
            run.trainer.finish()

    run.broker.reactions.append(finish_once_both_backlogs_are_published)
    try:
        run.run()
    finally:
        opener.cancel()

    assert len(at_pause) == 2, "the two syncs did not come"
    first = {s for s, (scoring, _) in at_pause[0].items() if scoring}
    assert held_back.sample_id in first, "the held sample was not being scored at the pause"
    still = {s for s, (scoring, _) in at_pause[1].items() if scoring} & first
    pauses = [e for e in run.events() if isinstance(e, ev.RolloutPaused)]
    samples = run.samples()
    after_second = {s.sample_id for s in samples[pauses[1].produced :]}
    if filters:
        assert not still and not first & after_second
        assert pauses[1].pause_s >= 0.5  # it waited for the gate
    else:
        assert held_back.sample_id in still and still <= after_second
        assert pauses[1].pause_s < 0.5
    for t in (t for s in samples if s.sample_id in first for t in s.trajectories):
        assert t.segment_versions == [0] and t.reward == 1.0


def test_a_partition_revoked_with_rewards_pending_loses_nothing(tmp_path):
    """The partition moves away while finished trajectories are being scored: the worker
    drains the scores first, so each of its samples ends once, published whole or logged to
    ``partials`` with its finished trajectories scored, never both, never neither."""
    reward, _ = _slow_reward(tmp_path)
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", STEPPED, *reward)
    run = Run(cfg, prompts=8)
    worker, step, moving = run.worker, run.worker.runner.step, []

    def revoke_while_scoring(timeout: float = 0.0):
        if not moving and worker.score.pending and worker.engine.num_active:
            moving.extend(worker.in_flight)
            run.sources[0].revoke()
            assert len(worker.in_flight) == 0 and not worker.score.pending
            run.trainer.finish()
        return step(timeout)

    worker.runner.step = revoke_while_scoring
    run.run()

    assert moving, "no revoke came while a reward was pending"
    published = {s.sample_id: s for s in run.samples()}
    logged = {p.sample.sample_id: p for p in run.partials()}
    assert set(published) | set(logged) == set(moving) and not set(published) & set(logged)
    assert logged, "nothing was decoding at the revoke"
    for t in (t for s in published.values() for t in s.trajectories):
        assert t.reward == 1.0 and t.segment_versions == [0]
    for t in (t for p in logged.values() for t in p.sample.trajectories):
        assert t.reward == (0.0 if t.finish_reason == "abort" else 1.0)


def test_an_in_flight_update_leaves_a_trajectory_being_scored_its_version(tmp_path):
    """Weights swapped in while finished trajectories are being scored (nothing drains, no
    pause): each keeps the version it finished under; those still decoding go on as a new
    segment."""
    reward, _ = _slow_reward(tmp_path)
    cfg = _cfg(
        tmp_path,
        "async_training.partial_rollout=true",
        "async_training.in_flight_update=true",
        STEPPED,
        *reward,
    )
    run = Run(cfg)
    worker, step, scoring = run.worker, run.worker.runner.step, set()

    def swap_while_scoring(timeout: float = 0.0):
        if not scoring and worker.score.pending and worker.engine.num_active:
            running = set(worker.runner.states)
            n = cfg.actor_rollout_ref.rollout.n
            scoring.update(
                f"{s}#{i}"
                for s in worker.in_flight
                for i in range(n)
                if f"{s}#{i}" not in running and i not in worker.in_flight[s].done
            )
            run.sync_new_weights()
            shadow = worker.shadow
            assert shadow is not None and shadow.ready.wait(10)
        return step(timeout)

    worker.runner.step = swap_while_scoring
    run.when_published(4, run.trainer.finish)
    run.run()

    assert scoring, "no swap came while a reward was pending"
    paused = next(e for e in run.events() if isinstance(e, ev.RolloutPaused))
    assert paused.n_partial == 0 and not run.partials()
    # The samples that had finished decoding at the swap: published after it, all version 0.
    after = run.samples()[paused.produced :]
    old = [s for s in after if all(t.segment_versions == [0] for t in s.trajectories)]
    assert paused.in_flight_finished == len(old) > 0  # the event says so (it was always 0)
    by_id = {s.sample_id: s for s in run.samples()}
    versions = {
        f"{sid}#{i}": t.segment_versions
        for sid, s in by_id.items()
        for i, t in enumerate(s.trajectories)
    }
    assert any(r in versions for r in scoring)
    assert all(versions[r] == [0] for r in scoring if r in versions)
    assert any(v == [0, 1] for v in versions.values()), "nothing decoded across the swap"
    assert all(t.reward == 1.0 for s in by_id.values() for t in s.trajectories)


def test_a_revoke_whose_abort_finds_a_request_ended_logs_no_trajectory_unscored(tmp_path):
    """The two changes crossed: a hand-back's abort that meets a request already ended (EOS,
    or its length) finishes it, and a custom reward scores it off the loop. The hand-back
    then logged the sample to ``partials`` with that trajectory neither done nor interrupted
    (a KeyError in ``log_partials``, or a partial missing it). It waits for those scores
    first: each sample is published whole or logged with every trajectory, never both."""
    reward, _ = _slow_reward(tmp_path)
    cfg = _cfg(tmp_path, "async_training.partial_rollout=true", SLOW_STEPS, *reward)
    run = Run(cfg, prompts=8)
    worker, moving = run.worker, []

    def revoke() -> None:
        moving.extend(worker.in_flight)
        run.sources[0].revoke()
        assert len(worker.in_flight) == 0
        run.trainer.finish()

    hit = _sync_once_a_result_waits(run, revoke)
    run.run()

    assert hit and moving, "no request had ended on the engine's thread before the run ended"
    published = {s.sample_id: s for s in run.samples()}
    logged = {p.sample.sample_id: p for p in run.partials()}
    assert set(published) | set(logged) >= set(moving)
    assert not set(published) & set(logged)
    n = cfg.actor_rollout_ref.rollout.n
    for p in logged.values():
        assert len(p.sample.trajectories) == n
        for t in p.sample.trajectories:
            assert t.reward == (0.0 if t.finish_reason == "abort" else 1.0)
