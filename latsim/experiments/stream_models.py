"""How an experiment's streams meet their devices: the engine's one injected strategy.

:class:`OneStream` is one stream on its own worker (DESIGN §2); :class:`SharedDevices` is
several streams sharing device pools (the serving model, §6). :func:`stream_model` picks
one for an experiment's ``serving`` setting, and the engine (:mod:`latsim.experiments.engine`)
asks its plan's model what differs (how a replication runs, its default lead, what its rows
and folder hold) instead of branching on which it has, as Ciw's simulation asks its node
classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from latsim.analysis.metrics import summarize
from latsim.model.serving import ServingConfig
from latsim.run.folder import write_records, write_serving_records
from latsim.run.serving import ServingRecords
from latsim.run.stream import RunRecords
from latsim.sim.simpy_driver import simulate_trace

if TYPE_CHECKING:
    from latsim.controller import ControllerConfig
    from latsim.controller.timing import Timing
    from latsim.model.arrivals import ArrivalSource
    from latsim.model.costs import CostModel
    from latsim.sim.serving import StreamInput


class CellParts(Protocol):
    """What a model reads of a cell (:class:`latsim.experiments.engine.Cell`)."""

    @property
    def config(self) -> ControllerConfig: ...

    @property
    def timing(self) -> Timing: ...


class PlanParts(Protocol):
    """What a model reads of a plan (:class:`latsim.experiments.engine.Plan`): its
    experiment's seed and record level, cost, arrivals, duration and replications."""

    experiment: Any
    cost: CostModel
    arrivals: ArrivalSource
    duration: float
    replications: int

#: ``--lead auto`` (the serving model's default): each policy's lead is C's (and the other
#: stages') 0.99 quantile plus the wait budget that holds its stalls to the target
#: (:mod:`latsim.model.lead`). ``--lead cost``: C's (and the other stages') quantile alone,
#: the single worker's default.
AUTO_LEAD = "auto"
COST_LEAD = "cost"
#: ``--lead adaptive``: C's (and the other stages') quantile plus a wait estimate each
#: stream's controller keeps from the device waits it sees (a running high quantile of
#: them, as TCP sets its retransmit timer from round trips;
#: :class:`latsim.controller.AdaptiveLead`), starting at the nD/D/1 quantile: no pilot run.
ADAPTIVE_LEAD = "adaptive"

#: The spawn key of a serving replication's batch-cost stream (beside the streams' keys).
BATCH_KEY = 2**32


def replication_streams(seed: int, replication: int) -> tuple:
    """Replication ``replication``'s (arrival, cost) streams: the children of child
    ``replication`` of ``SeedSequence(seed)`` (made directly, so that one replication does
    not spawn all of them)."""
    child = np.random.SeedSequence(seed, spawn_key=(replication,))
    return tuple(child.spawn(2))


class StreamModel(Protocol):
    """What differs between one stream on its own worker and streams sharing devices."""

    #: the serving configuration with its DiT degree resolved; None for one stream
    serving: ServingConfig | None
    #: how the lead is set when the experiment gives none (AUTO_LEAD or COST_LEAD)
    default_lead: str

    @property
    def streams(self) -> int:
        """Streams per replication."""
        ...

    @property
    def settings(self) -> ServingConfig:
        """Where the controller's per-stream settings (discard, in flight, bind) come
        from."""
        ...

    def lead_extra(self, K: int) -> float:
        """What the default lead adds to C's quantile (the other stages' quantiles)."""
        ...

    def closed_forms_hold(self) -> bool:
        """Whether the single-worker closed forms can describe a run (a cost that is one
        fixed C is checked by the engine)."""
        ...

    def run(self, p: PlanParts, cell: CellParts, replication: int) -> RunRecords | ServingRecords:
        """One replication of ``cell``."""
        ...

    def metrics(self, runs: list) -> dict:
        """The row's metrics over a cell's replications."""
        ...

    def write_records(self, out: Path, runs: Iterable, skip: tuple[str, ...]) -> list[Path]:
        """The record tables of an experiment folder."""
        ...

    def write_tables(self, out: Path, own: dict) -> list[Path]:
        """Tables beside the records and the summary (the serving model's per stream)."""
        ...


@dataclass(frozen=True)
class OneStream:
    """One stream on its own worker, which never waits for another stream's jobs."""

    serving: None = None
    default_lead: str = COST_LEAD

    @property
    def streams(self) -> int:
        return 1

    @property
    def settings(self) -> ServingConfig:
        return ServingConfig()  # its defaults are the single worker's settings

    def lead_extra(self, K: int) -> float:
        return 0.0

    def closed_forms_hold(self) -> bool:
        return True

    def run(self, p: PlanParts, cell: CellParts, replication: int) -> RunRecords:
        arrival_stream, cost_stream = replication_streams(p.experiment.seed, replication)
        trace = p.arrivals.trace(replication, np.random.default_rng(arrival_stream),
                                 p.duration, cell.timing)
        records, _ = simulate_trace(cell.config, p.cost, trace, p.duration,
                                    np.random.default_rng(cost_stream),
                                    records=p.experiment.records)
        return records

    def metrics(self, runs: list) -> dict:
        return summarize(runs).as_dict()

    def write_records(self, out: Path, runs: Iterable, skip: tuple[str, ...]) -> list[Path]:
        return write_records(out, runs, skip)

    def write_tables(self, out: Path, own: dict) -> list[Path]:
        return []


@dataclass(frozen=True)
class SharedDevices:
    """Streams sharing device pools in the serving model (``serving`` resolved)."""

    serving: ServingConfig
    default_lead: str = AUTO_LEAD

    @property
    def streams(self) -> int:
        return self.serving.streams

    @property
    def settings(self) -> ServingConfig:
        return self.serving

    def lead_extra(self, K: int) -> float:
        return self.serving.lead_extra(K)

    def closed_forms_hold(self) -> bool:
        return self.serving.trivial

    def run(self, p: PlanParts, cell: CellParts, replication: int) -> ServingRecords:
        from latsim.sim.serving import simulate_serving

        batch = np.random.SeedSequence(p.experiment.seed, spawn_key=(replication, BATCH_KEY))
        return simulate_serving(cell.config, p.cost, self.serving,
                                self.stream_inputs(p, cell, replication), p.duration,
                                np.random.default_rng(batch), records=p.experiment.records)

    def stream_inputs(self, p: PlanParts, cell: CellParts, replication: int) -> list[StreamInput]:
        """Every stream's arrivals, join time and random streams for one replication.

        Stream ``s`` draws its arrivals and DiT costs from children ``2s`` and ``2s + 1`` of
        replication ``replication`` of ``SeedSequence(seed)`` (stream 0 from exactly the
        single-worker streams, :func:`replication_streams`), its other stages from the
        children of its cost stream, and a random join time from the first child of its
        arrival stream: what a stream draws does not depend on how many streams there are.
        Trace sources give stream ``s`` trace ``(replication + s) mod n``.
        """
        from latsim.model.generators import SpawnedStreams
        from latsim.sim.serving import StreamInput

        serving, seed, T = self.serving, p.experiment.seed, cell.timing.T
        inputs = []
        for s in range(serving.streams):
            arrivals = np.random.SeedSequence(seed, spawn_key=(replication, 2 * s))
            costs = np.random.SeedSequence(seed, spawn_key=(replication, 2 * s + 1))
            if serving.start == "random":
                join = float(np.random.default_rng(arrivals.spawn(1)[0]).uniform(0, T))
            elif serving.start == "staggered":
                join = s * T / serving.streams
            else:
                join = 0.0
            trace = p.arrivals.trace((replication + s) % p.replications,
                                     np.random.default_rng(arrivals), p.duration, cell.timing)
            inputs.append(StreamInput(trace, join, np.random.default_rng(costs),
                                      SpawnedStreams(costs, 4)))
        return inputs

    def metrics(self, runs: list) -> dict:
        from latsim.analysis.serving import serving_metrics

        serving = self.serving
        return {"pools": ",".join(f"{name}={size}" for name, size in serving.pools),
                "schedule": serving.schedule, "start": serving.start,
                **serving_metrics(runs)}

    def write_records(self, out: Path, runs: Iterable, skip: tuple[str, ...]) -> list[Path]:
        return write_serving_records(out, runs, skip)

    def write_tables(self, out: Path, own: dict) -> list[Path]:
        from latsim.analysis.serving import per_stream_rows
        from latsim.run.files import write_rows_csv

        streams = [{"policy": policy, "K": K, **row}
                   for (K, policy), cell_runs in own.items()
                   for row in per_stream_rows(cell_runs)]
        write_rows_csv(out / "streams.csv", streams)
        return [out / "streams.csv"]


def stream_model(serving: ServingConfig | None) -> OneStream | SharedDevices:
    """The strategy for an experiment's ``serving`` setting, resolved (None: one stream)."""
    return OneStream() if serving is None else SharedDevices(serving)
