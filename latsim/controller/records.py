"""Flat, immutable records: the same types come out of simulation and live measurement.

One row per condition, job, played slot, stall and discard. ``pandas.DataFrame(records)``
works on any list of them. Plain data, no I/O: the run layer writes and reads them as CSV
(:mod:`latsim.run.record_files`).
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import MISSING, dataclass, fields
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform, overload

NAN = math.nan

_R = TypeVar("_R")


@dataclass_transform(frozen_default=True)
def record(cls: type[_R]) -> type[_R]:
    """A record type: a frozen dataclass with slots, pickled as its fields' values.

    Worker processes send back hundreds of thousands of records (``latsim reproduce``: 90 k
    jobs). A frozen dataclass pickles by default as its state, set field by field on load:
    about 3 µs a record each way; as the constructor's arguments it takes 1-2 µs."""
    cls = dataclass(frozen=True, slots=True)(cls)
    names = [f.name for f in fields(cls)]
    if len(names) < 2 or not all(f.init for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: a record has two or more fields, all in __init__")
    cls.__init__ = slot_init(cls)  # type: ignore[misc]
    values = attrgetter(*names)

    def __reduce__(self: _R) -> tuple[type[_R], tuple]:  # noqa: N807
        return cls, values(self)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


def slot_init(cls: type) -> Callable[..., None]:
    """An ``__init__`` for the frozen dataclass with slots ``cls``: the dataclass's own
    signature, each field stored with its slot's descriptor. The dataclass's own stores
    each field through ``object.__setattr__``: about 1.1 µs for an eight-field record
    (this takes 0.6), and 1.0 µs for a :class:`~latsim.controller.machine.StartJob` in the
    compiled build, where it stays Python (this takes 0.5). The simulator makes a record
    and a command per job and unpickles every record by it. Written as source and
    compiled, as :mod:`dataclasses` writes its own."""
    if "__post_init__" in vars(cls) or any(f.kw_only or f.default_factory is not MISSING
                                           for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: slot_init builds a dataclass with no "
                        "__post_init__, keyword-only fields or default factories")
    scope: dict[str, object] = {}
    parameters, body = [], []
    for f in fields(cls):
        scope[f"_set_{f.name}"] = vars(cls)[f.name].__set__
        if f.default is MISSING:
            parameters.append(f.name)
        else:
            scope[f"_default_{f.name}"] = f.default
            parameters.append(f"{f.name}=_default_{f.name}")
        body.append(f"        _set_{f.name}(self, {f.name})\n")
    # made in a closure over ``scope``, with the module's globals, as dataclasses does: so
    # that the annotations resolve where the class's own do (pdoc, typing.get_type_hints)
    made: dict[str, Any] = {}
    exec(f"def make({', '.join(scope)}):\n"
         f"    def __init__(self, {', '.join(parameters)}):\n{''.join(body)}"
         "    return __init__\n", vars(sys.modules[cls.__module__]), made)
    init = made["make"](**scope)
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__annotations__ = {**{f.name: f.type for f in fields(cls)}, "return": None}
    return init  # type: ignore[return-value]


@dataclass(frozen=True)
class Domain:
    """What a record type's fields hold beyond their types: checked where records are read
    back from files (:func:`latsim.run.record_files.read_csv`), so a damaged file is refused
    there, naming file and line, instead of read as numbers no run makes.

    By default an ``int`` field is >= 0 and a ``float`` field a finite number >= 0 (every
    float field of a record is a time or a duration, in seconds). A record type says where
    its fields differ in a class attribute ``DOMAIN`` (plain data, no I/O here)."""

    #: float fields that may be NaN (not known: a censored condition's times)
    unset: tuple[str, ...] = ()
    #: fields with another floor than 0: ``(name, lowest value)``
    lowest: tuple[tuple[str, float], ...] = ()
    #: ``(a, b)``: a <= b where both are set (a job is ready after it starts)
    order: tuple[tuple[str, str], ...] = ()
    #: fields set on every row whose ``displayed`` field is True
    shown: tuple[str, ...] = ()
    #: text fields that hold one of a few names: ``(name, the names)``
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()


#: What a job is (:attr:`JobRecord.kind`): the first chunks, a planned one, or one for a
#: new condition.
JOB_KINDS = ("prebuffer", "refill", "replan")
#: Every record type's domain unless it names its own (:class:`Domain`).
PLAIN = Domain()


def domain_of(record_type: type) -> Domain:
    """The :class:`Domain` of ``record_type``: its ``DOMAIN``, else :data:`PLAIN`."""
    found = getattr(record_type, "DOMAIN", PLAIN)
    return found if isinstance(found, Domain) else PLAIN


@record
class JobRecord:
    """A finished generation job (id 0 is the version-0 prebuffer, not a DiT call)."""

    job_id: int
    kind: str  # prebuffer | refill | replan
    branch: int  # first position produced
    length: int  # positions produced (K)
    version: int  # condition version it was conditioned on
    context: int  # clean latents available before ``branch``
    t_start: float
    t_ready: float

    DOMAIN = Domain(order=(("t_start", "t_ready"),), choices=(("kind", JOB_KINDS),))


@record
class SlotRecord:
    """A played latent slot."""

    position: int
    version: int
    job_id: int
    t_start: float


class SlotLog(Sequence[SlotRecord]):
    """The played slots, kept as four columns instead of one :class:`SlotRecord` per slot.

    A simulation plays far more slots than anything else (one per δ of stream time), and a
    record object per slot was the costliest thing the simulator made. The log reads as a
    sequence of :class:`SlotRecord` (each made when it is read), compares equal to any such
    sequence with the same rows, pickles as four lists, and offers the columns for bulk use
    (:meth:`rows`, :func:`count_slots_before`). Slots are appended in play order, so ``t_start``
    never decreases.
    """

    __slots__ = ("position", "version", "job_id", "t_start")

    def __init__(self, records: Iterable[SlotRecord] = ()) -> None:
        self.position: list[int] = []
        self.version: list[int] = []
        self.job_id: list[int] = []
        self.t_start: list[float] = []
        for record in records:
            self.append(record)

    def add(self, position: int, version: int, job_id: int, t_start: float) -> None:
        """Append one slot from its fields (the hot path: no record object)."""
        self.position.append(position)
        self.version.append(version)
        self.job_id.append(job_id)
        self.t_start.append(t_start)

    def extend(self, positions: Iterable[int], versions: Iterable[int],
               job_ids: Iterable[int], t_starts: Iterable[float]) -> None:
        """Append a run of slots, column by column (the four of the same length)."""
        self.position.extend(positions)
        self.version.extend(versions)
        self.job_id.extend(job_ids)
        self.t_start.extend(t_starts)

    def append(self, record: SlotRecord) -> None:
        self.add(record.position, record.version, record.job_id, record.t_start)

    def rows(self) -> Iterator[tuple[int, int, int, float]]:
        """``(position, version, job_id, t_start)`` per slot, in play order."""
        return zip(self.position, self.version, self.job_id, self.t_start, strict=True)

    def __len__(self) -> int:
        return len(self.t_start)

    @overload
    def __getitem__(self, index: int) -> SlotRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[SlotRecord]: ...
    def __getitem__(self, index: int | slice) -> SlotRecord | list[SlotRecord]:
        if isinstance(index, slice):
            return [SlotRecord(*row) for row in zip(
                self.position[index], self.version[index], self.job_id[index],
                self.t_start[index], strict=True)]
        return SlotRecord(self.position[index], self.version[index], self.job_id[index],
                          self.t_start[index])

    def __iter__(self) -> Iterator[SlotRecord]:
        return (SlotRecord(*row) for row in self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SlotLog):
            return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __getstate__(self) -> tuple[list, ...]:
        return (self.position, self.version, self.job_id, self.t_start)

    def __setstate__(self, state: tuple[list, ...]) -> None:
        self.position, self.version, self.job_id, self.t_start = state

    def __repr__(self) -> str:
        return f"SlotLog({len(self)} slots)"


#: What a run keeps of its records: ``all`` of them; ``conditions``: the per-condition and
#: per-event tables, with the per-slot and per-task ones (slots, serving tasks) only
#: counted into the summary as the run goes; ``none``: the same in memory, and no record
#: tables written (summaries only).
RECORD_LEVELS = ("all", "conditions", "none")
#: The record tables a level below ``all`` counts instead of keeping (and so never writes).
COUNTED_TABLES = ("slots", "tasks")


class SlotTally(SlotLog):
    """The played slots counted, not kept: what the summary needs of them (how many
    started before ``end``, and of those how many a DiT job generated), in O(1) memory.

    It takes slots as a :class:`SlotLog` does (:meth:`add`, or the columns then
    :meth:`fold`: the controller appends runs of slots to the columns and folds them in
    once :data:`FOLD_AT` wait, so a tick does not pay for a fold), so the controller plays
    the same way into either. The counts fold what waits before they are read. It reads
    as an empty sequence: no rows were kept; :func:`count_slots_before` answers from the
    counts."""

    __slots__ = ("end", "_played", "_before_end", "_generated_before_end")

    def __init__(self, end: float) -> None:
        super().__init__()
        self.end = end
        self._played = 0
        self._before_end = 0
        self._generated_before_end = 0

    def add(self, position: int, version: int, job_id: int, t_start: float) -> None:
        self.fold()  # in play order: what waits in the columns came first
        self._played += 1
        if t_start < self.end:
            self._before_end += 1
            if job_id:
                self._generated_before_end += 1

    def extend(self, positions: Iterable[int], versions: Iterable[int],
               job_ids: Iterable[int], t_starts: Iterable[float]) -> None:
        for row in zip(positions, versions, job_ids, t_starts, strict=True):
            self.add(*row)

    def add_counts(self, played: int, before_end: int, generated_before_end: int) -> None:
        """Count a run of slots a driver counted in bulk (played in order after those
        counted so far: ``played`` of them, ``before_end`` starting before ``end``, of
        which ``generated_before_end`` from a DiT job)."""
        self.fold()
        self._played += played
        self._before_end += before_end
        self._generated_before_end += generated_before_end

    def fold(self) -> None:
        """Count the slots appended to the columns, and empty them."""
        starts, job_ids = self.t_start, self.job_id
        if not starts:
            return
        self._played += len(starts)
        before = bisect_left(starts, self.end)  # t_start never decreases
        self._before_end += before
        self._generated_before_end += before - job_ids[:before].count(0)
        for column in (self.position, self.version, job_ids, starts):
            column.clear()

    @property
    def played(self) -> int:
        self.fold()
        return self._played

    @property
    def before_end(self) -> int:
        self.fold()
        return self._before_end

    @property
    def generated_before_end(self) -> int:
        self.fold()
        return self._generated_before_end

    def count_before(self, end: float, generated_only: bool = False) -> int:
        if end != self.end:
            raise ValueError(f"slots were counted before {self.end!r}, not {end!r}")
        return self.generated_before_end if generated_only else self.before_end

    # no rows are kept: an empty sequence, whatever waits to be folded
    def rows(self) -> Iterator[tuple[int, int, int, float]]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __getitem__(self, index: int | slice) -> SlotRecord | list[SlotRecord]:  # type: ignore[override]
        if isinstance(index, slice):
            return []
        raise IndexError("a SlotTally keeps no rows")

    def __iter__(self) -> Iterator[SlotRecord]:
        return iter(())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SlotTally):
            return self.__getstate__() == other.__getstate__()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple:  # type: ignore[override]
        return (self.end, self.played, self.before_end, self.generated_before_end)

    def __setstate__(self, state: tuple) -> None:  # type: ignore[override]
        self.position, self.version, self.job_id, self.t_start = [], [], [], []
        self.end, self._played, self._before_end, self._generated_before_end = state

    def __repr__(self) -> str:
        return f"SlotTally({self.played} slots counted, none kept)"


#: A :class:`SlotTally` folds its columns once this many slots wait in them.
FOLD_AT = 256


def count_slots_before(slots: Sequence[SlotRecord], end: float,
                       generated_only: bool = False) -> int:
    """Slots that started before ``end``; ``generated_only`` leaves out the prebuffer's
    (job 0). Reads a :class:`SlotLog`'s columns without making records, and a
    :class:`SlotTally`'s counts."""
    if isinstance(slots, SlotTally):
        return slots.count_before(end, generated_only)
    if isinstance(slots, SlotLog):
        played = bisect_left(slots.t_start, end)  # t_start never decreases
        return played - slots.job_id[:played].count(0) if generated_only else played
    return sum(1 for s in slots if s.t_start < end and (s.job_id > 0 or not generated_only))


@record
class StallRecord:
    """The player froze at ``position`` from ``t_start`` to ``t_end``."""

    position: int
    t_start: float
    t_end: float
    open_at_end: bool  # the run ended while still stalled

    DOMAIN = Domain(order=(("t_start", "t_end"),))


@record
class DiscardRecord:
    """``count`` cached positions of ``job_id`` from ``first`` on were replaced at ``t``."""

    job_id: int
    first: int
    count: int
    t: float
    by_version: int


@record
class ConditionRecord:
    """One condition: L = R + C + Q (DESIGN §2).

    ``displayed`` is False if the run ended before any output of version >= ``version``
    played (censored). ``superseded`` is True if the first such output had a newer version:
    the condition itself was never shown. Its R/C/Q/L then describe that newer response, the
    first display at least as new (DESIGN §2); summaries include them and count censored ones.
    """

    version: int
    t_arrival: float
    job_id: int
    t_start: float
    t_ready: float
    t_play: float
    R: float
    C: float
    Q: float
    L: float
    superseded: bool
    displayed: bool

    DOMAIN = Domain(
        unset=("t_start", "t_ready", "t_play", "R", "C", "Q", "L"),  # censored
        lowest=(("job_id", -1),),  # -1: no job showed it (censored)
        order=(("t_arrival", "t_start"), ("t_start", "t_ready"), ("t_ready", "t_play")),
        shown=("t_start", "t_ready", "t_play", "R", "C", "Q", "L"))

    @classmethod
    def shown(
        cls, version: int, t_arrival: float, job: JobRecord, t_play: float, superseded: bool
    ) -> ConditionRecord:
        return cls(
            version=version,
            t_arrival=t_arrival,
            job_id=job.job_id,
            t_start=job.t_start,
            t_ready=job.t_ready,
            t_play=t_play,
            R=job.t_start - t_arrival,
            C=job.t_ready - job.t_start,
            Q=t_play - job.t_ready,
            L=t_play - t_arrival,
            superseded=superseded,
            displayed=True,
        )

    @classmethod
    def censored(cls, version: int, t_arrival: float) -> ConditionRecord:
        return cls(version, t_arrival, -1, NAN, NAN, NAN, NAN, NAN, NAN, NAN, False, False)


RECORD_TYPES: dict[str, type] = {
    "conditions": ConditionRecord,
    "jobs": JobRecord,
    "slots": SlotRecord,
    "stalls": StallRecord,
    "discards": DiscardRecord,
}


def column_names(record_type: type) -> list[str]:
    return [f.name for f in fields(record_type)]
