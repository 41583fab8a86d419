"""``asyncrl bench sync``: moving a model's weights from the trainer to a rollout worker.

Two processes, as in a run: this one holds the trainer's weights, a receiver process holds a
worker's copy (same names and shapes, zeros). Models are state dicts shaped like Qwen2 (tied
embedding, q/k/v with biases, o, gate/up/down, RMSNorms) at ~50M and ~500M parameters, bf16 as
a GPU trainer would send them. Ways to move the bytes, each timed from "go" on the sender to
"loaded" on the receiver; a warm-up round (buffers allocated, pages faulted in) then several
timed rounds, median reported:

- ``in place``: what a worker on the trainer's host gets (``sync.shared_memory``): it maps
  the memory the trainer's weights live in and copies them into its own in one multi-tensor
  copy, between a token and an acknowledgement (``sync.direct``; the manifest is checked once,
  in the warm-up round).
- ``shared memory``: the slots, what such a worker got before and gets where its weights
  cannot be read in place: the trainer packs each bucket into one of two slots of memory it
  shares with the worker, which copies it out; a token and an acknowledgement per bucket.
- ``bucketed``: the weight collective as the trainer uses it for a worker on another host
  (``sync.bucket_size_mb`` buckets, two buffers each side, packing overlapped with the wire).
- ``per-tensor``: the same collective with one tensor per message (bucket_bytes=1), what a
  naive loop over ``named_parameters`` costs.
- ``safetensors``: through shared disk (``bench.snapshot``): the trainer writes a snapshot
  file (fsync'd, atomic rename), the worker loads it into its tensors.
- ``memcpy``: one in-memory copy of the same number of bytes in one process, the machine's
  limit for any of the above.

``device="cuda"`` (``--device``; ``auto`` picks it when there is a GPU) puts both ends' weights
on the GPU: ``in place`` and ``shared memory`` are then CUDA IPC handoffs (from the warm-up
round on, the worker reads the trainer's GPU memory), ``memcpy`` a device-to-device copy, and
the ways that
would only measure host staging (per-tensor, safetensors) are left out (first run on an H100
on 2026-11-24: docs/benchmarks.md). Both ends' weights then lie in one buffer per dtype, as the
roles keep them on a GPU (``asyncrl.models.flat``); ``in place, apart`` is the same handoff
with each tensor in memory of its own, as before 2026-11-26.

The ``checksum`` rows time each checksum format over the same weights (sync/checksum.py):
what each end of a verified sync adds to it (sha256-tree where the weights are on a CPU,
wsum64 where they are on a GPU).

After the last round of each way the receiver hashes its weights and the sender compares, so a
figure is only printed for a transfer that delivered every bit. The second half of a whole sync
(pause -> transfer -> load -> resumed, modes c and d) comes from ``asyncrl bench sync-pause``,
which this command runs at a reduced size unless ``pause_resume=False``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench import flags
from asyncrl.config import ConfigError, load_config

# hidden, layers, intermediate, vocab, attention heads, kv heads
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "5M": (256, 4, 768, 8192, 4, 2),  # smoke size
    "50M": (512, 12, 1536, 32000, 8, 2),
    "500M": (896, 24, 4864, 151936, 14, 2),  # Qwen2.5-0.5B's shape
}
DEFAULT_SHAPES = ("50M", "500M")
METHODS = ("shared memory", "in place", "bucketed", "per-tensor", "safetensors")
"""In this order: the slots' warm-up tells the trainer its worker is local, so the weights are
offered in place from the warm-up round of ``in place`` on."""
_WAIT = timedelta(seconds=600)


def qwen2_config(shape: str, vocab_size: int | None = None) -> Any:
    """A transformers ``Qwen2Config`` of ``shape`` (tied embeddings), with the shape's vocabulary
    or ``vocab_size``: what ``bench engine`` and ``tools/random_checkpoint.py`` initialise."""
    from transformers import Qwen2Config

    hidden, layers, inter, vocab, heads, kv_heads = SHAPES[shape]
    return Qwen2Config(
        vocab_size=vocab_size or vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=True,
    )


def qwen2_like_state(shape: str, fill: bool) -> dict[str, Any]:
    """Tensors named and shaped like a Qwen2 causal LM's state dict (bf16); random or zeros."""
    import torch

    hidden, layers, inter, vocab, heads, kv_heads = SHAPES[shape]
    kv = hidden // heads * kv_heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.q_proj.bias": (hidden,),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    shapes["model.norm.weight"] = (hidden,)
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, s in shapes.items():
        t = torch.zeros(s, dtype=torch.bfloat16)
        if fill:
            t.normal_(generator=g)
        out[name] = t
    out["lm_head.weight"] = out["model.embed_tokens.weight"]  # tied, sent once
    return out


def _nbytes(state: dict[str, Any]) -> int:
    seen: set[int] = set()
    total = 0
    for t in state.values():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def memcpy_seconds(nbytes: int, rounds: int, device: str = "cpu") -> float:
    """Median time of one in-memory copy of ``nbytes`` (source and target allocated once) on
    ``device``."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(rounds + 1):  # the first copy faults the target's pages in: not counted
        t0 = time.perf_counter()
        dst.copy_(src)
        if dst.is_cuda:
            torch.cuda.synchronize(dst.device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def on_device(state: dict[str, Any], device: str, flat: bool | None = None) -> dict[str, Any]:
    """``state`` moved to ``device``, its tied tensors still one tensor; in one buffer per
    dtype where ``flat`` (default: on a GPU, as the roles keep their weights there)."""
    from asyncrl.models.flat import flat_copies

    moved: dict[int, Any] = {}
    out = {name: moved.setdefault(t.data_ptr(), t.to(device)) for name, t in state.items()}
    if flat if flat is not None else not str(device).startswith("cpu"):
        out = flat_copies(out)
    return out


def _apart(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` with each tensor in memory of its own (tied ones still one)."""
    copies: dict[int, Any] = {}
    return {name: copies.setdefault(t.data_ptr(), t.clone()) for name, t in state.items()}


APART = "in place, apart"
"""The in-place handoff between weights that are not flat (each tensor in memory of its own)."""


def methods_for(device: str) -> tuple[str, ...]:
    """The ways measured: on a GPU, the two a run uses and the in-place one between weights
    kept apart (per-tensor and safetensors would time host staging, already measured on the
    CPU)."""
    return METHODS if device == "cpu" else ("shared memory", "in place", APART, "bucketed")


def _method_bucket_bytes(method: str, bucket_bytes: int) -> int:
    return 1 if method == "per-tensor" else bucket_bytes


def sync(
    config: str | None,
    overrides: list[str],
    console: Console,
    shapes: tuple[str, ...] = DEFAULT_SHAPES,
    rounds: int = 3,
    pause_resume: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time every way of moving weights for each model size; print and return the figures."""
    import torch
    import torch.distributed as dist

    from asyncrl.bench.snapshot import save_snapshot
    from asyncrl.launch.broker import free_port
    from asyncrl.launch.process import spawn
    from asyncrl.models.policy import resolve_device
    from asyncrl.sync.checksum import weights_checksum
    from asyncrl.sync.sender import WeightSender

    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:  # before any process starts, as bench engine's --shapes
        raise ConfigError(f"--shapes: no shape {', '.join(unknown)} (known: {', '.join(SHAPES)})")
    cfg = load_config(config, overrides)
    device = str(resolve_device(device))
    methods = methods_for(device)
    torch.set_num_threads(1)  # a trainer's host side; the receiver gets the other core
    bucket_bytes = int(cfg.sync.bucket_size_mb * 1024 * 1024)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}

    for shape in shapes:
        console.rule(f"{shape} parameters")
        state = on_device(qwen2_like_state(shape, fill=True), device)
        apart = _apart(state) if APART in methods else state
        nbytes = _nbytes(state)
        params = nbytes // 2
        console.log(f"{shape}: {params / 1e6:.0f}M parameters, {nbytes / 1e9:.2f} GB bf16")
        store_port, weights_port = free_port(), free_port()
        store = dist.TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
        sender = WeightSender(
            "127.0.0.1",
            weights_port,
            backend=cfg.sync.backend,
            device=device,
            timeout_s=cfg.sync.timeout_s,
        )
        sender.start()
        snap_dir = Path(tempfile.mkdtemp(prefix="bench-sync-", dir=out_dir))
        cmd = [
            sys.executable, "-m", "asyncrl.bench.sync",
            "--store-port", str(store_port), "--weights-port", str(weights_port),
            "--shape", shape, "--rounds", str(rounds + 1), "--bucket-bytes", str(bucket_bytes),
            "--backend", cfg.sync.backend, "--dir", str(snap_dir), "--device", device,
        ]  # fmt: skip
        proc, log_path = spawn(cmd, out_dir / f"bench-sync-receiver-{stamp}.log")
        row: dict[str, Any] = {"params": params, "bytes": nbytes}
        try:
            store.wait(["announce"], _WAIT)
            if not sender.connect(0, "bench"):
                raise RuntimeError(f"the receiver did not join; see {log_path}")
            expected = weights_checksum(state)
            for method in methods:
                times, shared, medium = [], 0, "collective"
                copies: list[float] = []  # the worker's copy alone, reading in place
                copy_way = ""
                for r in range(rounds + 1):
                    store.wait([f"ready/{method}/{r}"], _WAIT)
                    t0 = time.time()
                    if method == "safetensors":
                        path = save_snapshot(state, snap_dir, r)
                        store.set(f"snapshot/{r}", str(path))
                    else:  # the slots are offered for that way only
                        sender.shared_memory = method in ("shared memory", "in place", APART)
                        sender.in_place = method in ("in place", APART)
                        sent = sender.broadcast(
                            apart if method == APART else state,
                            _method_bucket_bytes(method, bucket_bytes),
                        )
                        shared, medium = sent.stats.shared, sent.stats.medium
                    store.wait([f"done/{method}/{r}"], _WAIT)
                    times.append(float(store.get(f"done/{method}/{r}")) - t0)
                    if r > 0 and store.check([f"copy/{method}/{r}"]):
                        seconds, copy_way = store.get(f"copy/{method}/{r}").decode().split(" ")
                        copies.append(float(seconds))
                    what = "warm-up" if r == 0 else f"round {r}/{rounds}"
                    console.log(f"{shape} {method} {what}: {times[-1]:.2f} s")
                store.wait([f"checksum/{method}"], _WAIT)
                if store.get(f"checksum/{method}").decode() != expected:
                    raise RuntimeError(f"{shape} {method}: the receiver's weights differ")
                row[method] = {
                    **_figures(times[1:], nbytes),
                    "shared_workers": shared,
                    "medium": medium,  # of the last round
                }
                if copies:
                    row[method] |= {"copy_s": statistics.median(copies), "copy_way": copy_way}
            proc.wait(timeout=60)
            row["memcpy"] = _figures([memcpy_seconds(nbytes, rounds, device)], nbytes)
            for way, like in CHECKSUMS.items():  # what each end adds to a verified sync
                row[way] = _figures([_checksum_seconds(state, like) for _ in range(rounds)], nbytes)
        finally:
            if proc.poll() is None:
                proc.kill()
            sender.close()
            del store
            for f in snap_dir.glob("*"):
                f.unlink()
            snap_dir.rmdir()
        results[shape] = row

    table = Table(
        title=f"weight transfer between two processes on one host ({device}), bf16, median"
    )
    for col in ("model", "way", "seconds", "GB/s", "vs memcpy"):
        table.add_column(col, justify="right")
    for shape, row in results.items():
        for method in (*methods, "memcpy", *CHECKSUMS):
            f = row[method]
            table.add_row(
                shape,
                method,
                f"{f['s']:.4f}",
                f"{f['gbps']:.2f}",
                f"{f['gbps'] / row['memcpy']['gbps']:.2f}",
            )
    console.print(table)
    for shape, row in results.items():
        parts = []
        for way in ("per-tensor", "safetensors"):
            if way in row:
                parts.append(f"{way} / bucketed time = {row[way]['s'] / row['bucketed']['s']:.2f}x")
        slots, direct = row["shared memory"], row["in place"]
        parts.append(
            f"shared memory ({slots['medium']}) / in place ({direct['medium']}) time = "
            f"{slots['s'] / direct['s']:.2f}x, bucketed / in place = "
            f"{row['bucketed']['s'] / direct['s']:.2f}x; of memcpy: in place "
            f"{direct['gbps'] / row['memcpy']['gbps']:.0%}, shared memory "
            f"{slots['gbps'] / row['memcpy']['gbps']:.0%}, bucketed "
            f"{row['bucketed']['gbps'] / row['memcpy']['gbps']:.0%}"
        )
        for way in ("in place", APART):
            f = row.get(way, {})
            if "copy_s" in f:
                parts.append(
                    f"{way}: the worker's copy ({f['copy_way']}) "
                    f"{f['copy_s'] * 1e3:.2f} ms of {f['s'] * 1e3:.2f} ms, "
                    f"{row['memcpy']['s'] / f['copy_s']:.0%} of memcpy's bandwidth"
                )
        tree, wsum = (row[way]["s"] for way in CHECKSUMS)
        parts.append(f"checksum sha256 / on-device format = {tree / wsum:.2f}x")
        console.print(f"{shape}: " + ", ".join(parts))
    figures: dict[str, Any] = {"transfer": results}
    if pause_resume:
        from asyncrl.bench.sync_pause import sync_pause

        console.rule("a whole sync: pause -> transfer -> load -> resumed, modes (c) and (d)")
        figures["sync_pause"] = sync_pause(
            config, ["trainer.total_training_steps=15", *overrides], console
        )
    out = out_dir / f"bench-sync-{stamp}.json"
    out.write_text(json.dumps(figures, indent=1))
    console.print(f"figures: {out}")
    return figures


CHECKSUMS = {"checksum sha256-tree": "sha256-tree:", "checksum wsum64": "wsum64:"}
"""The two checksum formats (sync/checksum.py), timed over the same weights: a run uses
sha256-tree for weights on a CPU and wsum64 for weights on a GPU."""


def _checksum_seconds(state: dict[str, Any], like: str) -> float:
    from asyncrl.sync.checksum import weights_checksum

    t0 = time.perf_counter()
    weights_checksum(state, like=like)  # ends on the host: no device work left running
    return time.perf_counter() - t0


def _figures(times: list[float], nbytes: int) -> dict[str, Any]:
    s = statistics.median(times)
    return {"s": s, "gbps": nbytes / s / 1e9, "rounds_s": times}


def _receive(argv: list[str]) -> None:
    """The receiver process: join, then for each way and round load what the sender sends."""
    import torch
    import torch.distributed as dist

    from asyncrl.bench.snapshot import load_snapshot
    from asyncrl.sync.checksum import weights_checksum
    from asyncrl.sync.receiver import WeightReceiver

    p = argparse.ArgumentParser(allow_abbrev=False)
    for name in ("--store-port", "--weights-port", "--rounds", "--bucket-bytes"):
        p.add_argument(name, type=int, required=True)
    for name in ("--shape", "--backend", "--dir", "--device"):
        p.add_argument(name, required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    flat = on_device(qwen2_like_state(a.shape, fill=False), a.device)
    apart = _apart(flat) if APART in methods_for(a.device) else flat
    store = dist.TCPStore("127.0.0.1", a.store_port, is_master=False, timeout=_WAIT)
    receiver = WeightReceiver("127.0.0.1", a.weights_port, backend=a.backend, device=a.device)
    receiver.join(0, "bench", lambda: store.set("announce", "1"))
    for method in methods_for(a.device):
        state = apart if method == APART else flat
        for t in state.values():
            t.zero_()
        for r in range(a.rounds):
            store.set(f"ready/{method}/{r}", "1")
            if method == "safetensors":
                store.wait([f"snapshot/{r}"], _WAIT)
                path = store.get(f"snapshot/{r}").decode()
                load_snapshot(state, path)
                Path(path).unlink()
                done = time.time()
            else:
                got = receiver.receive_into(state, _method_bucket_bytes(method, a.bucket_bytes))
                done = time.time()  # before the store's round trips
                if got.copy_s is not None:  # read in place: the copy's own time, and its way
                    store.set(f"copy/{method}/{r}", f"{got.copy_s!r} {got.copy_way}")
            store.set(f"done/{method}/{r}", repr(done))
        store.set(f"checksum/{method}", weights_checksum(state))
    receiver.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench sync``: its description and flags."""
    p.description = (
        "Weight transfer time and GB/s between two processes (shared-memory slots, the "
        "trainer's weights read in place, bucketed, per-tensor, a safetensors file) next to "
        "an in-memory copy of the same bytes; with --device cuda, the CUDA IPC handoffs and "
        "gloo next to a device-to-device copy; and the time of each checksum format (sha256, "
        "on-device) over the same weights."
    )
    p.add_argument(
        "--shapes",
        help="comma-separated model shapes, random weights: among 5M, 50M, 500M (default 50M,500M)",
    )
    flags.add_device(p)


def main(args: argparse.Namespace, console: Console) -> None:
    """``asyncrl bench sync``: its flags checked, then every way of moving weights timed."""
    device = flags.device(args)
    shapes = tuple(args.shapes.split(",")) if args.shapes else DEFAULT_SHAPES
    sync(args.config, args.overrides, console, shapes, device=device)


if __name__ == "__main__":
    _receive(sys.argv[1:])
