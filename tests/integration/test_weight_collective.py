"""The weight collective between real processes on loopback (gloo; NCCL only with 2 GPUs),
and the shared-memory slots that serve workers on the trainer's host.

Each rank is a spawned process that writes what it saw (checksums, state dicts, errors) to a
temp dir; the test compares those files. Every process has a deadline and every collective a
timeout, so a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn

from asyncrl.sync.checksum import weights_checksum
from asyncrl.sync.receiver import WeightReceiver
from asyncrl.sync.results import ManifestMismatchError, TransferStats
from asyncrl.sync.sender import WeightSender

LATE_S = 1.0  # the "late" scenario: the trainer starts each transfer this long after
PROCESS_DEADLINE_S = 30.0  # hang guard only: a normal run takes 2-7 s, even on a busy box
COLLECTIVE_TIMEOUT_S = 12.0
# bucket size per round: small buckets with oversized tensors, one tensor per bucket, one big
ROUND_BUCKET_BYTES = [4096, 1, 64 << 20]


class Small(nn.Module):
    """A few Linear layers, an embedding tied to the head, a bf16 buffer and an int64 buffer."""

    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(dim, dtype=torch.bfloat16))
        self.register_buffer("version", torch.zeros(1, dtype=torch.int64))


def _perturb(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=g).to(t.device, t.dtype))
            else:
                t.add_(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count_call(counts: list[int]) -> None:
    counts[-1] += 1


def _worker(
    rank: int,
    world_size: int,
    port: int,
    scenario: str,
    out: str,
    device: str,
    backend: str,
    shared: bool,
    in_place: bool = True,
) -> None:
    """One process: rank 0 is the trainer (sends), the others are workers (receive); results
    go to files in ``out``. ``shared``: this end's shared_memory setting; ``in_place``: the
    trainer offers its weights to be read in place (else the slots only)."""
    torch.set_num_threads(1)
    result: dict = {"rank": rank, "checksums": [], "initial": None, "error": None, "stats": []}
    outdir = Path(out)
    args = ("127.0.0.1", port, backend, torch.device(device), COLLECTIVE_TIMEOUT_S, shared)
    end = WeightSender(*args, in_place=in_place) if rank == 0 else WeightReceiver(*args)
    try:
        torch.manual_seed(0 if rank == 0 else 1000 + rank)
        dim = 48 if scenario == "mismatch" and rank == world_size - 1 else 32
        model = Small(dim=dim).to(device)
        cast = torch.bfloat16 if scenario == "cast" else None  # a float32 trainer, bf16 workers
        if scenario in ("cast", "uncast") and rank > 0:
            model.to(torch.bfloat16)
        result["initial"] = weights_checksum(model)
        if isinstance(end, WeightSender):
            end.start()
            for w in range(world_size - 1):
                assert end.connect(w, f"inc{w}")
        else:
            end.join(rank - 1, f"inc{rank - 1}", announce=lambda: None)
        rounds = (
            ROUND_BUCKET_BYTES
            if scenario in ("rounds", "cast", "awaited")
            else ROUND_BUCKET_BYTES[:1]
        )
        result["waiting_calls"] = []
        for k, bucket_bytes in enumerate(rounds):
            if isinstance(end, WeightSender):
                if scenario in ("late", "awaited"):
                    time.sleep(LATE_S)  # the trainer's next sync comes a step later
                _perturb(model, seed=k)  # the trainer's weights change between syncs
                sent = end.broadcast(model, bucket_bytes, dtype=cast)
                assert not sent.failed, sent.failed
                assert sorted(sent.delivered) == list(range(world_size - 1))
                stats = sent.stats
            else:
                if scenario == "awaited":  # what a worker does: poll its group while it waits
                    result["waiting_calls"].append(0)
                    end.await_transfer(functools.partial(_count_call, result["waiting_calls"]))
                stats = end.receive_into(model, bucket_bytes)
            assert model.head.weight is model.embed.weight
            result["stats"].append(vars(stats))
            result["checksums"].append(weights_checksum(model, dtype=cast))
            sd = {
                k2: v.detach().cpu().to(cast or v.dtype) if v.is_floating_point() else v.cpu()
                for k2, v in model.state_dict().items()
            }
            torch.save(sd, outdir / f"rank{rank}_round{k}.pt")
    except ManifestMismatchError as err:
        result["error"] = f"ManifestMismatchError: {err}"
    except Exception:
        result["error"] = traceback.format_exc()
    finally:
        end.close()
    (outdir / f"rank{rank}.json").write_text(json.dumps(result))


def _run(
    world_size: int,
    scenario: str,
    out: Path,
    device: str = "cpu",
    backend: str = "gloo",
    shared: tuple[bool, ...] | None = None,
    in_place: bool = True,
):
    """``shared``: each rank's shared_memory setting (default: on everywhere)."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    shared = shared or (True,) * world_size
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, scenario, str(out), device, backend, shared[r], in_place),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + PROCESS_DEADLINE_S
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    assert not hung, f"ranks {hung} still running after {PROCESS_DEADLINE_S} s (hang)"
    assert [p.exitcode for p in procs] == [0] * world_size
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def _assert_bit_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k


def _check_rounds(results: list[dict], out: Path, shared: int = 0) -> None:
    """Every receiver got the sender's weights bit for bit, each round; ``shared`` of them
    read them from the shared slots."""
    errors = [r["error"] for r in results if r["error"]]
    assert not errors, errors[0]
    sender, receivers = results[0], results[1:]
    for rec in receivers:
        assert rec["initial"] != sender["initial"]  # receivers start from other weights
        assert rec["checksums"] == sender["checksums"]
    assert len(set(sender["checksums"])) == len(ROUND_BUCKET_BYTES)  # weights changed
    for k in range(len(ROUND_BUCKET_BYTES)):
        want = torch.load(out / f"rank0_round{k}.pt")
        for r in range(1, len(results)):
            _assert_bit_equal(want, torch.load(out / f"rank{r}_round{k}.pt"))
    stats = [TransferStats(**s) for s in sender["stats"]]
    assert all(s.bytes == stats[0].bytes > 0 and s.tensors == 9 for s in stats)
    assert stats[1].buckets == 9  # 1-byte buckets: one per tensor
    assert stats[2].buckets == 3  # fp32, bf16, int64
    assert all(s.gbps > 0 for s in stats)
    assert [s.shared for s in stats] == [shared] * len(stats)
    for rec in receivers:
        assert {s["shared"] for s in rec["stats"]} <= {0, 1}
        for s in rec["stats"]:
            assert (s["medium"] == "collective") == (s["shared"] == 0)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "collective"])
def test_two_processes_three_syncs_bit_exact(tmp_path: Path, shared: bool) -> None:
    results = _run(2, "rounds", tmp_path, shared=(shared, shared))
    _check_rounds(results, tmp_path, shared=int(shared))
    assert [s["shared"] for s in results[1]["stats"]] == [int(shared)] * len(ROUND_BUCKET_BYTES)
    # shared: the first transfer tells the trainer its worker is local (slots); from the
    # next, the worker reads the trainer's weights in place, the manifest checked once
    media = ["memfd", "direct_memfd", "direct_memfd"] if shared else ["collective"] * 3
    assert [s["medium"] for s in results[0]["stats"]] == media
    assert [s["medium"] for s in results[1]["stats"]] == media
    checked = [True, True, not shared]
    assert [s["checked"] for s in results[0]["stats"]] == checked
    assert [s["checked"] for s in results[1]["stats"]] == checked


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "collective"])
def test_a_workers_wait_for_the_trainers_transfer_is_told_apart_from_the_transfer(
    tmp_path: Path, shared: bool
) -> None:
    """An in-flight update's thread waits in ``receive_into`` for the trainer's next sync; the
    report's "weights receive + load" read that wait as the transfer (373 ms a sync, with a
    sync every step of ~0.3 s, for a model moved in milliseconds)."""
    results = _run(2, "late", tmp_path, shared=(shared, shared))
    assert not [r["error"] for r in results if r["error"]]
    got = results[1]["stats"][0]
    assert got["waited_s"] >= 0.8 * LATE_S
    assert got["seconds"] - got["waited_s"] < 0.5 * LATE_S
    assert results[1]["checksums"] == results[0]["checksums"]


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "collective"])
def test_a_worker_awaiting_a_late_transfer_is_called_back_to_poll_its_group(
    tmp_path: Path, shared: bool
) -> None:
    """A sync's transfer opens once every worker has paused: a stopped worker made the others
    wait in ``receive_into`` without polling their prompts group, past its max.poll.interval,
    so they left it too, and on Tansu the group never formed again (the trainer waited for
    samples until it timed out). ``await_transfer`` calls back while it waits, on the gloo
    opening (the first transfer, or a pair across hosts) and on the fast channel, and the
    transfer that follows is bit-exact."""
    results = _run(2, "awaited", tmp_path, shared=(shared, shared))
    _check_rounds(results, tmp_path, shared=int(shared))
    calls = results[1]["waiting_calls"]
    assert len(calls) == len(ROUND_BUCKET_BYTES)
    assert all(n >= 1 for n in calls), calls  # LATE_S = 1 s, a call every AWAIT_SLICE_S


def test_three_processes_one_reading_shared_memory_one_over_the_collective(tmp_path: Path):
    """A worker with shared memory off keeps the collective while another on the same host
    reads the slots, in the same transfers."""
    results = _run(3, "rounds", tmp_path, shared=(True, True, False))
    _check_rounds(results, tmp_path, shared=1)
    assert {s["shared"] for s in results[1]["stats"]} == {1}
    assert {s["shared"] for s in results[2]["stats"]} == {0}


def test_trainer_without_shared_memory_serves_everyone_over_the_collective(tmp_path: Path):
    _check_rounds(_run(3, "rounds", tmp_path, shared=(False, True, True)), tmp_path, shared=0)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-memory", "collective"])
def test_float32_weights_reach_bf16_workers_cast_while_packed(tmp_path: Path, shared: bool):
    """rollout.dtype=bfloat16 under a float32 trainer: each sync casts while packing, so a
    worker holds the trainer's weights rounded to bf16, bit for bit, and its checksum equals
    the trainer's of the cast weights (which WeightsPublished carries)."""
    results = _run(2, "cast", tmp_path, shared=(shared, shared))
    errors = [r["error"] for r in results if r["error"]]
    assert not errors, errors[0]
    sender, receiver = results
    assert receiver["checksums"] == sender["checksums"]
    assert len(set(sender["checksums"])) == len(ROUND_BUCKET_BYTES)
    for k in range(len(ROUND_BUCKET_BYTES)):
        got = torch.load(tmp_path / f"rank1_round{k}.pt")
        _assert_bit_equal(torch.load(tmp_path / f"rank0_round{k}.pt"), got)
        assert {t.dtype for t in got.values()} == {torch.bfloat16, torch.int64}
    stats = [TransferStats(**s) for s in sender["stats"]]
    float32_bytes = (64 * 32 + 3 * (32 * 32 + 32)) * 4
    assert stats[0].bytes == float32_bytes // 2 + 32 * 2 + 8  # bf16 on the wire, and the buffers
    assert stats[2].buckets == 2  # bf16 (the cast and the bf16 buffer), int64


def test_manifest_mismatch_fails_on_both_sides(tmp_path: Path) -> None:
    results = _run(2, "mismatch", tmp_path)
    for r in results:
        assert r["error"] and r["error"].startswith("ManifestMismatchError"), r["error"]
        assert "weight manifest mismatch" in r["error"]
        assert (
            "embed.weight: trainer torch.float32 [64, 32], worker 0 torch.float32 [64, 48]"
            in (r["error"])
        )


def test_workers_in_another_dtype_than_the_trainer_sends_are_told_why(tmp_path: Path) -> None:
    """bf16 workers, a trainer sending float32 (``rollout.dtype`` resolved differently on the
    two hosts): both ends fail naming the key to set."""
    for r in _run(2, "uncast", tmp_path):
        assert r["error"] and r["error"].startswith("ManifestMismatchError"), r["error"]
        assert "actor_rollout_ref.rollout.dtype" in r["error"]
        assert "trainer torch.float32 [64, 32], worker 0 torch.bfloat16 [64, 32]" in r["error"]


def _rejoining_worker(port: int, incarnation: str, die: bool, out: str) -> None:
    """A worker incarnation: joins, receives once, then either dies (SIGKILL) or receives again."""
    torch.set_num_threads(1)
    torch.manual_seed(7)
    model = Small()
    rx = WeightReceiver("127.0.0.1", port, "gloo", torch.device("cpu"), COLLECTIVE_TIMEOUT_S)
    rx.join(0, incarnation, announce=lambda: None)
    rx.receive_into(model, 4096)
    checksums = [weights_checksum(model)]
    if die:
        os.kill(os.getpid(), signal.SIGKILL)
    rx.receive_into(model, 4096)
    checksums.append(weights_checksum(model))
    Path(out, f"{incarnation}.json").write_text(json.dumps(checksums))
    rx.close()


def test_killed_worker_is_dropped_and_its_restart_rejoins(tmp_path: Path) -> None:
    """A pair whose worker died fails fast and alone; a new incarnation forms a new pair."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    model = Small()
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        first = ctx.Process(target=_rejoining_worker, args=(port, "a", True, str(tmp_path)))
        first.start()
        assert tx.connect(0, "a")
        sent = [weights_checksum(model)]
        assert tx.broadcast(model, 4096).delivered == {0: "a"}
        first.join(PROCESS_DEADLINE_S)
        assert first.exitcode == -signal.SIGKILL
        _perturb(model, seed=1)
        t0 = time.monotonic()
        lost = tx.broadcast(model, 4096)
        assert time.monotonic() - t0 < COLLECTIVE_TIMEOUT_S / 2  # fails fast, no timeout wait
        assert list(lost.failed) == [0] and not lost.delivered
        assert tx.members == {}  # the dead pair is closed

        second = ctx.Process(target=_rejoining_worker, args=(port, "b", False, str(tmp_path)))
        second.start()
        assert tx.connect(0, "b")
        assert tx.broadcast(model, 4096).delivered == {0: "b"}
        sent.append(weights_checksum(model))
        _perturb(model, seed=2)
        assert tx.broadcast(model, 4096).delivered == {0: "b"}
        sent.append(weights_checksum(model))
        second.join(PROCESS_DEADLINE_S)
        assert second.exitcode == 0
    assert json.loads((tmp_path / "b.json").read_text()) == sent[1:]


def test_join_times_out_naming_master_port() -> None:
    # a worker with nobody listening on the port: must fail fast with a useful message
    rx = WeightReceiver("127.0.0.1", _free_port(), "gloo", torch.device("cpu"), 1.0)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="sync.master_port"):
        rx.join(0, "x", announce=lambda: None)
    assert time.monotonic() - start < 15


def test_unanswered_join_gives_up_and_backend_is_checked() -> None:
    with WeightSender("127.0.0.1", _free_port(), "auto", "cpu", 1.0) as tx:
        assert tx.backend == "gloo"
        assert not tx.connect(0, "nobody")  # announced, never formed its end: not a member
        assert tx.members == {}
    with pytest.raises(ValueError, match="nccl"):
        WeightSender("127.0.0.1", 1, "nccl", torch.device("cpu"), 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "slots"])
def test_one_gpu_trainer_and_worker_hand_over_through_cuda_ipc(tmp_path: Path, in_place: bool):
    """Both ends on one GPU (gloo pairs: NCCL cannot put two ranks on one device): the first
    transfer goes through host memory, where the worker says it is local and on a GPU; from
    the next one the worker copies the trainer's weights straight from its GPU memory (or,
    slots only, the buckets go through slots in GPU memory)."""
    results = _run(2, "rounds", tmp_path, device="cuda:0", backend="gloo", in_place=in_place)
    _check_rounds(results, tmp_path, shared=1)
    kinds = [s["medium"] for s in results[1]["stats"]]
    later = "direct_cuda" if in_place else "cuda"
    assert kinds[0] == "memfd" and set(kinds[1:]) == {later}, kinds


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL between ranks needs 2 GPUs")
def test_nccl_two_gpus(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker, args=(r, 2, port, "rounds", str(tmp_path), f"cuda:{r}", "nccl", True)
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    _check_rounds(results, tmp_path)


def _state(seed: int) -> dict[str, torch.Tensor]:
    """Three tensors, one bucket each at bucket_bytes=1: the big last one lands in slot 0,
    where the next transfer's first bucket goes, and takes a while to copy out."""
    g = torch.Generator().manual_seed(seed)
    sizes = {"a": 1024, "b": 1024, "c": 16 << 20}
    return {k: torch.randn(n, generator=g) for k, n in sizes.items()}


def _targeted_worker(
    port: int, worker: int, transfers: int, out: str, incarnation: str = ""
) -> None:
    torch.set_num_threads(1)
    state = _state(100 + worker)
    rx = WeightReceiver("127.0.0.1", port, "gloo", torch.device("cpu"), COLLECTIVE_TIMEOUT_S)
    rx.join(worker, incarnation or f"inc{worker}", announce=lambda: None)
    sums, media = [], []
    for _ in range(transfers):
        media.append(rx.receive_into(state, 1).medium)
        sums.append(weights_checksum(state))
    rx.close()
    Path(out, f"w{worker}.json").write_text(json.dumps({"sums": sums, "media": media}))


def test_a_transfer_to_other_workers_waits_until_the_slots_were_copied_out(tmp_path: Path):
    """Weights go to worker 0, then at once to worker 1 alone (as a joining worker gets them)
    while worker 0 is stopped mid-copy: the second transfer must wait before it refills the
    slot worker 0 still has to copy from."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_targeted_worker, args=(port, w, 2, str(tmp_path))) for w in (0, 1)]
    sent = []
    slots_only = {"in_place": False}  # the slots' reuse is what is tested
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S, **slots_only) as tx:
        for p in procs:
            p.start()
        assert tx.connect(0, "inc0") and tx.connect(1, "inc1")
        for k, workers in enumerate(([0], [1], [0, 1])):
            state = _state(k)
            result = tx.broadcast(state, 1, workers)
            if k == 0:  # worker 0 has its tokens, the big bucket is still being copied
                os.kill(procs[0].pid, signal.SIGSTOP)
                threading.Timer(0.5, os.kill, (procs[0].pid, signal.SIGCONT)).start()
            assert sorted(result.delivered) == workers and result.stats.shared == len(workers)
            sent.append(weights_checksum(state))
        for p in procs:
            p.join(PROCESS_DEADLINE_S)
    assert [p.exitcode for p in procs] == [0, 0]
    w0 = json.loads((tmp_path / "w0.json").read_text())
    w1 = json.loads((tmp_path / "w1.json").read_text())
    assert w0["sums"] == [sent[0], sent[2]] and w1["sums"] == [sent[1], sent[2]]
    assert set(w0["media"]) == set(w1["media"]) == {"memfd"}


def test_a_worker_restarted_before_the_next_transfer_gets_its_weights(tmp_path: Path) -> None:
    """A worker killed mid-copy, before it acknowledged a transfer over shared memory (the
    trainer awaits those acknowledgements at its next transfer), is restarted, and its new
    incarnation (same worker id) joins before any other transfer. Settling the dead pair's
    acknowledgements must not close the new pair: the join transfer reaches the new worker
    (before the fix it was closed, and the worker died with 'the weight transfer failed')."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        first = ctx.Process(target=_targeted_worker, args=(port, 0, 2, str(tmp_path), "a"))
        first.start()
        assert tx.connect(0, "a")
        assert tx.broadcast(_state(0), 1).delivered == {0: "a"}
        os.kill(first.pid, signal.SIGKILL)  # it has its tokens, the big bucket is being copied
        first.join(PROCESS_DEADLINE_S)

        second = ctx.Process(target=_targeted_worker, args=(port, 0, 2, str(tmp_path), "b"))
        second.start()
        assert tx.connect(0, "b")  # no transfer since the kill
        sent = []
        for k in (1, 2):
            state = _state(k)
            assert tx.broadcast(state, 1).delivered == {0: "b"}
            sent.append(weights_checksum(state))
        second.join(PROCESS_DEADLINE_S)
        assert second.exitcode == 0
    assert json.loads((tmp_path / "w0.json").read_text())["sums"] == sent


def test_a_local_worker_reads_the_weights_in_place_and_follows_them_when_they_move(
    tmp_path: Path,
) -> None:
    """From the second transfer on, a worker on the trainer's host copies the trainer's
    tensors straight from its memory: one token, one acknowledgement, the manifest checked
    only when the trainer's tensors moved (a new epoch). Bit for bit every time."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    proc = ctx.Process(target=_targeted_worker, args=(port, 0, 5, str(tmp_path)))
    sent, checked, media = [], [], []
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        proc.start()
        assert tx.connect(0, "inc0")
        state = _state(0)
        for k in range(5):
            if k == 2:  # a step: the same tensors, new values
                with torch.no_grad():
                    state["b"].mul_(-1)
            if k == 3:  # a tensor replaced: the worker must map the new memory
                state["a"] = torch.randn(1024, generator=torch.Generator().manual_seed(9))
            result = tx.broadcast(state, 1)
            assert result.delivered == {0: "inc0"} and result.stats.shared == 1
            sent.append(weights_checksum(state))
            checked.append(result.stats.checked)
            media.append(result.stats.medium)
        proc.join(PROCESS_DEADLINE_S)
    assert proc.exitcode == 0
    got = json.loads((tmp_path / "w0.json").read_text())
    assert got["sums"] == sent and len(set(sent)) == 3
    assert media == ["memfd"] + ["direct_memfd"] * 4 == got["media"]
    assert checked == [True, True, False, True, False]


def _reader_then(port: int, out: str, then: str) -> None:
    """A worker on the trainer's host: three transfers (slots, then in place twice), then
    either dies (``kill``) or waits for a fourth and writes what happened (``wait``)."""
    torch.set_num_threads(1)
    state = _state(100)
    rx = WeightReceiver("127.0.0.1", port, "gloo", torch.device("cpu"), COLLECTIVE_TIMEOUT_S)
    rx.join(0, "r", announce=lambda: None)
    media = [rx.receive_into(state, 1).medium for _ in range(3)]
    if then == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    Path(out, "ready").write_text("")
    t0 = time.monotonic()
    try:
        rx.receive_into(state, 1)
        error = ""
    except Exception as err:
        error = type(err).__name__
    Path(out, "r.json").write_text(
        json.dumps({"media": media, "error": error, "waited_s": time.monotonic() - t0})
    )


def test_a_worker_reading_in_place_that_dies_is_dropped_at_once(tmp_path: Path) -> None:
    """Its openings and acknowledgements go over the pair's fast channel (a Unix socket):
    the trainer's next transfer finds it closed, without waiting out a timeout."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    proc = ctx.Process(target=_reader_then, args=(port, str(tmp_path), "kill"))
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        proc.start()
        assert tx.connect(0, "r")
        state = _state(0)
        media = [tx.broadcast(state, 1).stats.medium for _ in range(3)]
        assert media == ["memfd", "direct_memfd", "direct_memfd"]
        assert tx._pairs[0][1].fast is not None  # the fast channel carried the last two
        proc.join(PROCESS_DEADLINE_S)
        assert proc.exitcode == -signal.SIGKILL
        t0 = time.monotonic()
        lost = tx.broadcast(state, 1)
        assert time.monotonic() - t0 < COLLECTIVE_TIMEOUT_S / 2
        assert list(lost.failed) == [0] and not lost.delivered and tx.members == {}


def test_a_worker_reading_in_place_learns_at_once_that_the_trainer_is_gone(tmp_path: Path):
    ctx = mp.get_context("spawn")
    port = _free_port()
    proc = ctx.Process(target=_reader_then, args=(port, str(tmp_path), "wait"))
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        proc.start()
        assert tx.connect(0, "r")
        state = _state(0)
        for _ in range(3):
            assert tx.broadcast(state, 1).delivered == {0: "r"}
        deadline = time.monotonic() + PROCESS_DEADLINE_S
        while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    proc.join(PROCESS_DEADLINE_S)  # the trainer's end closed on leaving the block
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["media"] == ["memfd", "direct_memfd", "direct_memfd"]
    # a RuntimeError, as gloo's failures are: the follower takes it for the trainer's death
    assert got["error"] == "WeightChannelError" and got["waited_s"] < COLLECTIVE_TIMEOUT_S / 2


def test_fast_channels_left_by_dead_workers_are_not_taken_for_a_new_ones(tmp_path: Path):
    """A worker killed between connecting its fast channel and replying leaves a connection
    the trainer never accepted: the next worker's accept must skip it (it introduces itself
    as another pair), not hand the new worker a dead channel."""
    ctx = mp.get_context("spawn")
    port = _free_port()
    proc = ctx.Process(target=_targeted_worker, args=(port, 0, 3, str(tmp_path)))
    with WeightSender("127.0.0.1", port, "gloo", "cpu", COLLECTIVE_TIMEOUT_S) as tx:
        name = tx._fast_listener()
        assert name
        stale = []
        for hello in (b"0/a-dead-incarnation", b""):  # a dead worker's; one cut short
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect("\0" + name)
            sock.sendall(len(hello).to_bytes(8, "little") + hello if hello else b"\x01")
            stale.append(sock)
        stale[1].close()
        proc.start()
        assert tx.connect(0, "inc0")
        state = _state(0)
        for _ in range(3):
            assert tx.broadcast(state, 1).delivered == {0: "inc0"}
        assert tx._pairs[0][1].fast is not None
        proc.join(PROCESS_DEADLINE_S)
        for sock in stale:
            sock.close()
    assert proc.exitcode == 0
    got = json.loads((tmp_path / "w0.json").read_text())
    assert got["media"] == ["memfd", "direct_memfd", "direct_memfd"]
    assert len(got["sums"]) == 3
