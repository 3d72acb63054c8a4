"""The built-in placement policies of a fleet (DESIGN §8), registered as ``latsim.placements``
entry points the way a third party registers its own.

Each entry is a factory: called once per run, it returns the chooser
(:class:`~latsim.plugins.protocols.Placement`) the control plane asks for every session it
places, with the nodes that have room (in node order, never empty) and the run's placement
random stream. Ties go to the lowest node index, so a run is reproducible.

- ``round-robin``: the next node after the one chosen last, in index order;
- ``least-loaded``: the fewest sessions;
- ``power-of-two``: two distinct nodes drawn at random, the one with fewer sessions;
- ``min-max``: the lowest predicted per-chunk latency after placement (TurboServe's rule:
  the worst chunk latency of the fleet is kept as low as it can be);
- ``least-slack``: the node whose playing streams have the most playout slack left, by
  their least one (SlackServe's signal, used for placement: the node least at risk).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from latsim.plugins.protocols import NodeLoad, Placement

#: Sort keys of the built-in placements (C-level tuples: placement scans every node with
#: room for every session that arrives).
_BY_SESSIONS = attrgetter("sessions", "index")
_BY_CHUNK = attrgetter("chunk_s", "sessions", "index")


def round_robin() -> Placement:
    last = [-1]

    def choose(nodes: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        after = [n for n in nodes if n.index > last[0]]
        chosen = after[0] if after else nodes[0]
        last[0] = chosen.index
        return chosen

    return choose


#: A chooser with this attribute set to True picks the node of fewest sessions, ties to the
#: lowest index, and draws nothing: a control plane that keeps its nodes with room indexed
#: by sessions may answer it from that index instead of offering every node (a sharded
#: plan's does, :class:`latsim.sim.fleet._Fleet`).
FEWEST_SESSIONS = "fewest_sessions"


def least_loaded() -> Placement:
    def choose(nodes: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        return min(nodes, key=_BY_SESSIONS)

    setattr(choose, FEWEST_SESSIONS, True)
    return choose


def power_of_two() -> Placement:
    def choose(nodes: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        if len(nodes) == 1:
            return nodes[0]
        first, second = rng.choice(len(nodes), size=2, replace=False)
        return min(nodes[int(first)], nodes[int(second)], key=_BY_SESSIONS)

    return choose


def min_max() -> Placement:
    def choose(nodes: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        return min(nodes, key=_BY_CHUNK)

    return choose


def least_slack() -> Placement:
    def choose(nodes: Sequence[NodeLoad], rng: np.random.Generator) -> NodeLoad:
        return min(nodes, key=lambda n: (-n.slack_s, n.sessions, n.index))

    return choose
