"""Weight versions as a tree, from the control log: how far apart two versions' weights are.

Version numbers only grow, but after a trainer restart they no longer count syncs along one
line. A restarted trainer publishes its checkpoint's weights under a new number
(``TrainerResumed``), and the versions the dead trainer published past its checkpoint are
weights no trainer holds any more: a dead branch. The distance that staleness promises
(docs/design.md, "Staleness on the lineage") is counted on this tree:

- a version published at a sync is a child of the trainer's version before it;
- a ``TrainerResumed(version, step, checkpoint_version)`` stands where its checkpoint's weights
  stand: those of the step the checkpoint was taken at. If the dead trainer published a
  version at that very step (its sync right after the checkpoint) that version held the same
  weights, and the resumed version is the same node; if the checkpoint's version was published
  at that step, it is that one; otherwise the resumed weights are one update past the
  checkpoint's version (a child of it);
- the lag of a sample's version ``s`` at the trainer's version ``t`` is the number of syncs on
  the path between them: ``t``'s depth minus ``s``'s where ``s`` is an ancestor, and a dead
  branch's depth past the fork plus the live one's distance from it otherwise.

Pure bookkeeping over decoded events: the trainer feeds it the events it reads, the audit the
whole log.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from asyncrl.schemas import control as ev


@dataclass(eq=False)
class Node:
    """One set of weights; several version numbers may name it (a resumed trainer's)."""

    version: int
    """The first version number that named these weights."""
    depth: int
    """Syncs from the run's first weights along the lineage."""
    step: int
    """The trainer's step these weights are the result of."""
    parent: Node | None


class Lineage:
    """The version tree of one run, fed control events in log order."""

    def __init__(self, events: Iterable[ev.ControlEvent] = ()) -> None:
        self.nodes: dict[int, Node] = {}
        self.children: dict[int, list[Node]] = {}
        """Per node (by ``id``), the nodes published as its children, in log order."""
        self.head: Node | None = None
        """The weights of the trainer publishing now."""
        for event in events:
            self.feed(event)

    def feed(self, event: ev.ControlEvent) -> None:
        if isinstance(event, ev.WeightsPublished):
            self.published(event.version, event.step)
        elif isinstance(event, ev.TrainerResumed):
            self.resumed(event.version, event.step, event.checkpoint_version)

    def published(self, version: int, step: int) -> None:
        """A WeightsPublished: a new version is a child of the trainer's current one; one
        already known (a joiner's copy of the current weights) only says where the trainer is."""
        known = self.nodes.get(version)
        if known is not None:
            self.head = known
            return
        parent = self.head
        node = Node(version, parent.depth + 1 if parent else version, step, parent)
        self._add(version, node)

    def resumed(self, version: int, step: int, checkpoint_version: int) -> None:
        """A TrainerResumed: ``version`` names the weights of the checkpoint taken at ``step``
        under ``checkpoint_version`` (module docstring)."""
        if version in self.nodes:
            self.head = self.nodes[version]
            return
        base = self.nodes.get(checkpoint_version)
        if base is None:  # a log that starts mid-run: no earlier versions to place it by
            node = Node(version, checkpoint_version, step, None)
        elif base.step == step:
            node = base
        else:
            same = [c for c in self.children.get(id(base), []) if c.step == step]
            node = same[-1] if same else Node(version, base.depth + 1, step, base)
        self._add(version, node)

    def _add(self, version: int, node: Node) -> None:
        if node.version == version and node.parent is not None:
            self.children.setdefault(id(node.parent), []).append(node)
        self.nodes[version] = node
        self.head = node

    def depth(self, version: int) -> int | None:
        node = self.nodes.get(version)
        return None if node is None else node.depth

    def same(self, a: int, b: int) -> bool:
        """Versions ``a`` and ``b`` name the same weights."""
        node = self.nodes.get(a)
        return node is not None and node is self.nodes.get(b)

    def lag(self, sample_version: int, trainer_version: int) -> int | None:
        """Syncs on the path between the two versions' weights (None: one is not on the log).
        Never negative: a sample of a dead branch deeper than the trainer is as far as the
        path to it."""
        a, b = self.nodes.get(sample_version), self.nodes.get(trainer_version)
        if a is None or b is None:
            return None
        distance = 0
        while a is not b:
            if a.depth >= b.depth and a.parent is not None:
                distance += a.depth - a.parent.depth
                a = a.parent
            elif b.parent is not None:
                distance += b.depth - b.parent.depth
                b = b.parent
            else:  # two roots (a log that starts mid-run): their depths' difference
                return distance + abs(a.depth - b.depth)
        return distance
