"""Where a sync's time goes, hop by hop, read from the control events a run left on its log.

Every control event carries ``ts`` (the wall clock of the process that published it, when it
published it), and the events that end a phase carry the phase's own duration (``pause_s``,
``transfer_s``, ``load_s``). Between two events published by different processes, the
difference of their ``ts`` less the work the second did is the Kafka hop: publish, the broker,
the other side's poll. The processes must share a clock (one machine, or NTP-close).

A paused sync (modes c and d), per worker:

    SyncRequested (trainer) -> worker reads it, pauses (pause_s) -> RolloutPaused
    -> trainer reads the last RolloutPaused -> broadcast (transfer_s) -> WeightsPublished
    -> worker reads it, compares the checksum -> WeightsLoaded -> RolloutResumed

An in-flight update (no pause): SyncRequested and the broadcast at once, WeightsPublished; the
worker swaps when both the weights and WeightsPublished are in, and publishes its three
events then.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import median

from asyncrl.config import RunConfig
from asyncrl.schemas import control as ev

HOPS = (
    ("SyncRequested -> worker paused", "request_to_paused"),
    ("  the pause itself (pause_s; in flight: the swap)", "pause"),
    ("RolloutPaused -> trainer sends", "paused_to_send"),
    ("SyncRequested -> WeightsPublished (in flight)", "request_to_published"),
    ("  the weight transfer (transfer_s)", "transfer"),
    ("WeightsPublished -> WeightsLoaded", "published_to_loaded"),
    ("WeightsLoaded -> RolloutResumed", "loaded_to_resumed"),
    ("WeightsPublished -> RolloutResumed (in flight)", "published_to_resumed"),
    ("SyncRequested -> RolloutResumed", "total"),
)
"""(row label, key) of a sync's phases, in the order they happen; a paused sync has the rows
without "(in flight)", an in-flight update those with it and the pause, transfer and total."""


def sync_hops(events: list[ev.ControlEvent]) -> list[dict[str, float]]:
    """One row per (sync, worker) with each phase's seconds (see the module doc); syncs cut
    short (a worker left, a trainer restarted) are left out."""
    requests = {e.version: e for e in events if isinstance(e, ev.SyncRequested)}
    published = {
        e.version: e for e in events if isinstance(e, ev.WeightsPublished) and e.version in requests
    }
    by_worker: dict[tuple[int, int], dict[type, ev.ControlEvent]] = defaultdict(dict)
    last_paused: dict[int, float] = {}
    for e in events:
        if isinstance(e, (ev.RolloutPaused, ev.WeightsLoaded, ev.RolloutResumed)):
            by_worker[(e.version, e.worker)].setdefault(type(e), e)
        if isinstance(e, ev.RolloutPaused):
            last_paused[e.version] = max(e.ts, last_paused.get(e.version, e.ts))
    rows = []
    for (version, worker), got in sorted(by_worker.items()):
        req, pub = requests.get(version), published.get(version)
        paused = got.get(ev.RolloutPaused)
        loaded, resumed = got.get(ev.WeightsLoaded), got.get(ev.RolloutResumed)
        if req is None or pub is None or paused is None or loaded is None or resumed is None:
            continue
        assert isinstance(paused, ev.RolloutPaused)
        in_flight = pub.ts <= paused.ts  # the worker swapped after the weights were announced
        row = {
            "version": float(version),
            "worker": float(worker),
            "in_flight": float(in_flight),
            "pause": paused.pause_s,
            "transfer": pub.transfer_s,
            "total": resumed.ts - req.ts,
        }
        if in_flight:
            row["request_to_published"] = pub.ts - req.ts
            row["published_to_resumed"] = resumed.ts - pub.ts
        else:
            row["request_to_paused"] = paused.ts - req.ts
            row["paused_to_send"] = pub.ts - pub.transfer_s - last_paused[version]
            row["published_to_loaded"] = loaded.ts - pub.ts
            row["loaded_to_resumed"] = resumed.ts - loaded.ts
        rows.append(row)
    return rows


def hop_medians(rows: list[dict[str, float]]) -> dict[str, float]:
    """The median of each phase over ``rows`` (seconds)."""
    keys = {k for row in rows for k in row} - {"version", "worker", "in_flight"}
    return {k: median(row[k] for row in rows if k in row) for k in sorted(keys)}


def archived_control_events(log_dir: Path, control_topic: str) -> list[ev.ControlEvent]:
    """The control events of a run's log archive (``asyncrl run`` writes it), in log order."""
    from asyncrl.launch.log_archive import archived_partitions, read_partition

    events = []
    for (topic, _partition), path in archived_partitions(log_dir).items():
        if topic == control_topic:
            events += [ev.decode_event(r.value, dict(r.headers)) for r in read_partition(path)]
    return events


def run_control_events(cfg: RunConfig) -> list[ev.ControlEvent]:
    """The control events of a finished run: from its log archive (an embedded broker's run),
    else from ``kafka.bootstrap_servers``."""
    from asyncrl.launch.log_archive import has_archive, log_dir

    if has_archive(cfg):
        return archived_control_events(log_dir(cfg), cfg.topic("control"))
    from asyncrl.kafka.records import read_records

    if cfg.kafka.bootstrap_servers is None:
        raise ValueError(f"run {cfg.run_id}: no log archive and no kafka.bootstrap_servers")
    return [
        ev.decode_event(r.value, r.headers)
        for r in read_records(cfg, cfg.kafka.bootstrap_servers, "control")
    ]
