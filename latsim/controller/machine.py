"""The sans-IO controller: prediction cache, commitment, refill and replan (DESIGN §2–3).

Pure logic, shared by the SimPy simulator and the live harness. It imports no clock,
no simulator and no tensor library: the driver passes ``now`` with every event and
carries out the commands it gets back. Its two control states and their transitions
are data (:data:`TRANSITIONS`): :meth:`Controller.handle` dispatches every event, and the
decide step after it, through that table alone (by event type, guards tried in order), and
:func:`mermaid_diagram` prints it.

Inputs (events): :class:`ConditionArrived`, :class:`JobStarted`, :class:`JobDone`,
:class:`SlotDue`, :class:`WakeUp`. Outputs (commands): :class:`StartJob`, :class:`ScheduleWakeUp`,
:class:`PlaySlot`; plus flat records (see :mod:`latsim.controller.records`).
"""

from __future__ import annotations

import enum
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from latsim.controller.config import ControllerConfig
from latsim.controller.records import (
    FOLD_AT,
    ConditionRecord,
    DiscardRecord,
    JobRecord,
    SlotLog,
    SlotRecord,
    SlotTally,
    StallRecord,
    slot_init,
)

#: Tolerance for comparing times that are sums of floats (slot starts, job ends).
EPS = 1e-9
#: With ``forget_jobs``, how many job records wait before the done ones are forgotten.
FORGET_JOBS_AT = 64


class State(enum.Enum):
    """Control state. Playback runs in both."""

    PRODUCE = "Produce"  # a generation job is running
    CONSUME = "Consume"  # no job running: predictions are replayed from the cache

    # by identity: Enum's own hash is Python code, and the tick path looks a state up
    __hash__ = object.__hash__


# ---------------------------------------------------------------- events (inputs)
# Dispatch is by type; :data:`EVENT_KINDS` labels them (the event logs and the printed table).


@dataclass(frozen=True, slots=True)
class ConditionArrived:
    """The viewer sent a new condition; the controller gives it the next version."""

    payload: Any = None


@dataclass(frozen=True, slots=True)
class JobStarted:
    """A device took job ``job_id`` after it waited in a queue (the serving model's shared
    pools): the job's ``t_start`` becomes now, so the wait counts in R, not in C. A driver
    whose worker starts every job at once need not send it."""

    job_id: int


@dataclass(frozen=True, slots=True)
class JobDone:
    """The generator finished job ``job_id``: all its outputs are ready now."""

    job_id: int


@dataclass(frozen=True, slots=True)
class SlotDue:
    """Playback tick: the slot of ``position`` is due to start now."""

    position: int


@dataclass(frozen=True, slots=True)
class WakeUp:
    """A wake-up the controller asked for (refill check). Stale wake-ups are harmless."""



Event = ConditionArrived | JobStarted | JobDone | SlotDue | WakeUp


class Decide:
    """Not an event: the trigger of the decide step, taken after every event and at start."""

    __slots__ = ()


#: Each trigger's label, by type. (Not a class attribute: the compiled build's frozen
#: dataclasses take an annotated one for a field.)
EVENT_KINDS: dict[type, str] = {
    ConditionArrived: "condition_arrived", JobStarted: "job_started", JobDone: "job_done",
    SlotDue: "slot_due", WakeUp: "wake_up", Decide: "decide",
}


# ---------------------------------------------------------------- commands (outputs)


@dataclass(frozen=True, slots=True)
class StartJob:
    """Run the generator: sample positions ``branch .. branch+length-1`` under ``version``.

    ``context`` is how many clean latents before ``branch`` exist (played or cached) and can
    be fed as prefix context. ``kind`` is ``refill`` or ``replan``.
    """

    job_id: int
    kind: str
    branch: int
    length: int
    version: int
    context: int


@dataclass(frozen=True, slots=True)
class ScheduleWakeUp:
    """Deliver ``event`` back to the controller at time ``at``."""

    at: float
    event: SlotDue | WakeUp


@dataclass(frozen=True, slots=True)
class PlaySlot:
    """The player shows ``position`` (from ``job_id``, condition ``version``) from ``at``."""

    position: int
    version: int
    job_id: int
    at: float


Command = StartJob | ScheduleWakeUp | PlaySlot

# A refill cycle makes an event and a command or two: each built by slot_init's __init__,
# not the frozen dataclass's own (object.__setattr__ a field; Python even when compiled)
for _made_per_job in (ConditionArrived, JobStarted, JobDone, SlotDue, StartJob,
                      ScheduleWakeUp, PlaySlot):
    _made_per_job.__init__ = slot_init(_made_per_job)  # type: ignore[method-assign]


# ---------------------------------------------------------------- transitions as data


@dataclass(frozen=True)
class Transition:
    """One row of the transition table; the table alone drives :meth:`Controller.handle`.

    ``trigger`` is an event type, or :class:`Decide` for the step the controller takes after
    every event. ``source=None`` means any state; ``target=None`` means the state is kept.
    Rows with the same (state, trigger) are tried in order and the first whose ``guard``
    holds fires: ``guard=None`` always holds, else ``Controller._guard_<guard>(event, now)``
    returns None (it does not hold) or a value that ``Controller._act_<action>`` receives in
    place of the event (the decide step has no event: None). An event with no row that fires
    is an error; a state with no :class:`Decide` rows takes no decision.
    """

    source: State | None
    trigger: type[Event] | type[Decide]
    guard: str | None
    target: State | None
    action: str
    note: str


P, C_ = State.PRODUCE, State.CONSUME
TRANSITIONS: tuple[Transition, ...] = (
    Transition(None, ConditionArrived, None, None, "register_condition",
               "new version pending; a running job is never aborted (a flush drops its "
               "output when it lands)"),
    Transition(None, SlotDue, None, None, "play_or_stall",
               "play the cached slot, or stall; stale ticks are ignored"),
    Transition(None, WakeUp, None, None, "forget_due_refill",
               "forget the armed refill once due, so decide re-checks it "
               "(in Produce one is armed only with room for another chunk in flight)"),
    Transition(P, JobStarted, None, None, "note_job_start",
               "a device took the queued job: its wait counts in R"),
    Transition(P, JobDone, "last_job", C_, "finish_job",
               "cache K predictions (on-ready: replacing the old future now; flushed: "
               "discard them); eager commit locks them; end a stall"),
    Transition(P, JobDone, None, None, "finish_job",
               "the same, with another chunk still in flight"),
    Transition(C_, Decide, "replan_feasible", P, "start_replan",
               "pending version and a branch before the cache end: sample K from it "
               "(on-start: discard the future now)"),
    Transition(C_, Decide, "refill_due", P, "start_refill",
               "cache end due within lead: sample the next K"),
    Transition(C_, Decide, None, C_, "arm_refill", "wake up when the refill is due"),
    Transition(P, Decide, "flush_replan_feasible", None, "start_flush_replan",
               "flush policy, pending version and a branch before the planned end: drop the "
               "cached future from it and flush the chunks in flight behind it; sample K"),
    Transition(P, Decide, "refill_due_in_flight", None, "start_refill",
               "room for another chunk in flight and the planned end due within lead"),
    Transition(P, Decide, "room_in_flight", None, "arm_refill",
               "room in flight: wake up when the next refill is due"),
    Transition(P, Decide, None, None, "hold",
               "no room in flight (with one chunk, always): wait for a job to end"),
)


def _sources(row: Transition) -> tuple[State, ...]:
    return tuple(State) if row.source is None else (row.source,)


def _label(row: Transition) -> str:
    guard = f" [{row.guard}]" if row.guard else ""
    return f"{EVENT_KINDS[row.trigger]}{guard} / {row.action}"


def mermaid_diagram() -> str:
    """The transition table as a Mermaid ``stateDiagram-v2``."""
    lines = [
        "stateDiagram-v2",
        "    [*] --> Consume: start / prebuffer K latents with version 0",
    ]
    kept = []
    for row in TRANSITIONS:
        if row.source is None and row.target is None:
            kept.append(f"        {_label(row)}")  # a self-loop on every state: one note
            continue
        for state in _sources(row):
            target = state if row.target is None else row.target
            lines.append(f"    {state.value} --> {target.value}: {_label(row)}")
    if kept:
        lines += ["    note right of Produce", "        in any state, keeping it:", *kept,
                  "    end note"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the controller


# The controller's own books: plain classes, so that the compiled build makes them in C
# (a dataclass's __init__ stays Python there). Compared by identity.
class _RunningJob:
    __slots__ = ("job_id", "kind", "branch", "version", "t_start", "context", "flushed_by",
                 "submitted")

    def __init__(self, job_id: int, kind: str, branch: int, version: int, t_start: float,
                 context: int) -> None:
        self.job_id = job_id
        self.kind = kind
        self.branch = branch
        self.version = version
        self.t_start = t_start
        self.context = context
        #: the version whose replan flushed it: its output is dropped
        self.flushed_by: int | None = None
        #: when it was started (t_start moves to the device's start, if it waited)
        self.submitted = t_start


class _OpenCondition:
    __slots__ = ("version", "t_arrival")

    def __init__(self, version: int, t_arrival: float) -> None:
        self.version = version
        self.t_arrival = t_arrival


class Controller:
    """Prediction cache + commitment + refill/replan decisions, driven by events.

    Typical driver loop::

        commands = ctrl.start(now)
        ...execute commands; when something happens: commands = ctrl.handle(event, now)
        ...at the end: ctrl.finish(now)

    Records accumulate in :attr:`conditions`, :attr:`jobs`, :attr:`slots` (a columnar
    :class:`~latsim.controller.records.SlotLog`), :attr:`stalls` and :attr:`discards`; an
    optional ``on_record`` callback also receives each one as it is made (the live harness
    appends them to disk as the run goes); ``slots`` may be a
    :class:`~latsim.controller.records.SlotTally`, which counts the played slots instead of
    keeping them. A simulating driver may skip the ticks that would
    only play a slot (:meth:`play_ahead`).
    """

    #: :data:`TRANSITIONS` compiled by :func:`_compile`: state -> trigger -> rows.
    _dispatch: ClassVar[_Dispatch]
    #: Per state, what :meth:`play_ahead` checks after a play: ``"none"`` (no decide row),
    #: ``"consume"`` or ``"produce"`` (the rows of :data:`_QUIET_DECIDE_ACTIONS`) or None
    #: (rows it does not know: no skipping).
    _quiet_decide: ClassVar[dict[State, str | None]]
    #: Whether the table's rows are those the refill cycle's fast paths stand in for
    #: (:meth:`quiet_wake`, :meth:`quiet_job_started`, :meth:`quiet_job_done`).
    _quiet_cycles: ClassVar[bool]

    def __init__(
        self, config: ControllerConfig, on_record: Callable[[object], None] | None = None,
        slots: SlotLog | None = None, forget_jobs: bool = False,
    ) -> None:
        self.config = config
        self._K = config.timing.K
        self._delta = config.timing.delta
        self._q = config.policy.commit_unit(self._K)
        self._eager = config.policy.commit == "eager"
        self._lead = self._refill_lead = self._branch_lead = 0.0
        self._plan_with(config.lead)
        adaptive = config.adaptive
        self._adaptive = adaptive is not None
        # the adaptive lead's books (AdaptiveLead): its cost part, steps and wait estimate
        self._lead_cost = 0.0 if adaptive is None else adaptive.cost
        self._lead_up, self._lead_down = (0.0, 0.0) if adaptive is None else adaptive.steps
        self._wait_estimate = config.lead - self._lead_cost
        self._discard_on_ready = config.discard == "on-ready"
        self._max_in_flight = config.in_flight
        self._flush = config.in_flight_policy == "flush"
        self._start_at_cache_end = (config.replan_at_cache_end == "start"
                                    and not self._eager)
        self._bind_at_start = config.bind == "start"
        self._on_record = on_record

        self.state = State.CONSUME
        self._rows = self._dispatch[self.state]  # the rows of self.state, by trigger
        self._started = False
        self._cache: dict[int, tuple[int, int]] = {}  # position -> (version, job_id), ready
        self._cache_end = 0  # first position not ready: the end of the playable cache
        self._planned_end = 0  # first position neither cached nor in a live job in flight
        self._locked_end = 0  # positions below are committed: never replaced
        self._next_pos = 0  # next position to play
        self._next_due = 0.0  # when it is due (if not stalled)
        self._stalled_since: float | None = None
        self._latest_version = 0
        self._planned_version = 0
        self._running: list[_RunningJob] = []  # jobs in flight, in start order
        self._live = 0  # of them, not flushed
        self._next_job_id = 1
        self._armed_refill: float | None = None
        self._open: list[_OpenCondition] = []
        self._played_version = 0

        self.conditions: list[ConditionRecord] = []
        self.jobs: list[JobRecord] = []
        # forget the records of jobs no condition can resolve to any more (a driver that
        # keeps no job table): memory in O(1) per stream, not O(jobs)
        self._forget_jobs = forget_jobs
        self.slots = SlotLog() if slots is None else slots
        self._fold_slots = isinstance(self.slots, SlotTally)
        #: the slot log's four columns (lists it appends to and empties in place)
        self._columns = (self.slots.position, self.slots.version, self.slots.job_id,
                         self.slots.t_start)
        self.stalls: list[StallRecord] = []
        self.discards: list[DiscardRecord] = []
        self._tables: dict[type, Any] = {  # where _emit puts each record type
            ConditionRecord: self.conditions, JobRecord: self.jobs, SlotRecord: self.slots,
            StallRecord: self.stalls, DiscardRecord: self.discards}
        self.played = 0
        self.discarded = 0
        self.jobs_started = 0
        self.jobs_done = 0
        self.events_handled = 0
        self.slots_played_ahead = 0

    # ------------------------------------------------------------ public API

    def start(self, now: float) -> list[Command]:
        """Pre-buffer positions ``0..K-1`` with version 0 and schedule the first slot."""
        if self._started:
            raise RuntimeError("controller already started")
        self._started = True
        self._next_due = now
        for pos in range(self._K):
            self._cache[pos] = (0, 0)
        self._cache_end = self._planned_end = self._K
        if self._eager:
            self._locked_end = self._K
        self._emit(JobRecord(0, "prebuffer", 0, self._K, 0, 0, now, now))
        out: list[Command] = [ScheduleWakeUp(now, SlotDue(0))]
        self._decide(now, out)
        return out

    def handle(self, event: Event, now: float) -> list[Command]:
        """Feed one event at time ``now``; returns the commands to carry out."""
        if not self._started:
            raise RuntimeError("call start() before handle()")
        self.events_handled += 1
        out: list[Command] = []
        self._fire(self._rows.get(type(event), ()), event, now, out)
        self._decide(now, out)
        return out

    def play_ahead(self, horizon: float) -> int:
        """Event skipping: play the next slots whose ticks fall strictly before ``horizon``
        without the ticks, for as long as a tick would do nothing but play its slot.
        Returns how many slots it played; the driver then asks for the tick of
        :attr:`next_position` at :attr:`next_due` itself.

        The driver promises three things: the tick of the next slot is pending (asked for
        at :attr:`next_due`, not delivered, and the driver takes it back when this plays
        it), nothing but ticks would reach the controller before ``horizon`` (an event at
        a tick's very time ends the skip there, whichever of the two came first), and each
        tick would be delivered at exactly the time asked. Then the records are those of the
        tick-by-tick path, byte for byte (``tests/test_play_ahead.py`` checks it across the
        property generators).

        A tick is *quiet* when its slot is cached (else the tick starts a stall) and the
        decide step after it commands nothing. In Consume the rows are tried in order:
        ``replan_feasible`` cannot hold without a pending version, and with one its branch
        is computed from the state the play would leave; ``refill_due`` and ``arm_refill``
        read the refill's due time, computed from that state too. Both by the methods the
        guards use, so the floats are the same. In Produce only ``hold`` fires without room
        for another chunk in flight (with one chunk, always); with room the refill rows are
        checked as in Consume, and a pending version under the flush policy ends the skip.
        A table with other decide rows is not skipped (:data:`_QUIET_DECIDE_ACTIONS`).
        """
        if self._next_due >= horizon:
            return 0
        played = self._play_quiet(self._next_due, horizon, -1)[0]
        self.slots_played_ahead += played
        return played

    def play_tick(self, position: int, now: float) -> bool:
        """The fast path of a tick: play the slot of ``position`` now and return True if
        the tick is quiet (as :meth:`play_ahead` decides it); then the tick's commands
        would have been ``PlaySlot(position, …, now)`` and a ``ScheduleWakeUp`` of the next
        tick at :attr:`next_due`, and the driver carries those out itself. Else (False)
        nothing changed: :meth:`handle` the tick."""
        return position == self._next_pos and self._play_quiet(now, math.inf, 1)[0] == 1

    def quiet_wake(self, now: float) -> StartJob | None:
        """The fast path of a refill cycle's wake-up (a driver playing whole chunks, not
        events): if a :class:`WakeUp` at ``now`` would only start the refill it was armed
        for, start it and return the :class:`StartJob` :meth:`handle` would have returned,
        the books the same. That is in Consume, with one chunk in flight, no version
        pending, no stall, and the armed refill due by ``now``, by the guards' own sums.
        Else (None) nothing changed: :meth:`handle` the wake-up."""
        armed = self._armed_refill
        if (not self._quiet_cycles or self.state is not State.CONSUME
                or self._max_in_flight != 1 or self._stalled_since is not None
                or self._latest_version > self._planned_version or armed is None
                or armed > now + EPS or self._refill_due_at(now) > now + EPS):
            return None
        self.events_handled += 1
        job = self._new_job("refill", self._planned_end, now)  # forgets the armed refill
        self.state = State.PRODUCE
        self._rows = self._dispatch[State.PRODUCE]
        return job

    def quiet_job_started(self, job_id: int, now: float) -> bool:
        """The fast path of :class:`JobStarted` when it only notes the start: the job is
        the only one in flight and no version is pending (so binding at the start keeps
        its version), and the decide step after it holds. Returns True, the books as
        :meth:`handle` keeps them (it would return no command; nothing a quiet tick reads
        changed), or False with nothing changed: :meth:`handle` it."""
        running = self._running
        if (not self._quiet_cycles or self.state is not State.PRODUCE
                or len(running) != 1 or running[0].job_id != job_id
                or self._max_in_flight != 1 or self._latest_version > self._planned_version
                or running[0].version != self._latest_version):
            return False
        self.events_handled += 1
        running[0].t_start = now
        return True

    def quiet_job_done(self, job_id: int, now: float) -> StartJob | float | None:
        """The fast path of the other end of a refill cycle: if :class:`JobDone` of
        ``job_id``, the only job in flight, at ``now`` would only cache its chunk and then
        arm the next refill or start it at once, do so and return the next refill's due
        time (the :class:`ScheduleWakeUp` of a :class:`WakeUp` :meth:`handle` would have
        returned) or its :class:`StartJob`. That is with no version pending and no stall
        (one would end and play a slot). Else (None) nothing changed: :meth:`handle` it."""
        running = self._running
        if (not self._quiet_cycles or self.state is not State.PRODUCE
                or len(running) != 1 or running[0].job_id != job_id
                or self._max_in_flight != 1 or self._stalled_since is not None
                or self._latest_version > self._planned_version
                or self._armed_refill is not None):
            return None
        self.events_handled += 1
        self._finish_job(job_id, now, [])  # no stall ends: it commands nothing
        due = self._refill_due_at(now)
        if due <= now + EPS:
            return self._new_job("refill", self._planned_end, now)
        self.state = State.CONSUME
        self._rows = self._dispatch[State.CONSUME]
        self._armed_refill = due
        return due

    def play_quiet_shifted(self, clock: float, origin: float, horizon: float,
                           dry: bool = False) -> tuple[int, float]:
        """:meth:`play_ahead` for a driver whose clock is this controller's shifted by
        ``origin`` (clock = controller time + origin) and which schedules each tick as
        ``clock + max(0, (due + origin) - clock)`` from the tick before (the serving
        model's streams): the next tick is pending at ``clock``, each next one at that
        float sum, and the ticks played are those quiet ones before ``horizon`` (on the
        clock) that resolve no condition (the driver shows those itself). With ``dry`` it
        only counts them, changing nothing. Returns (how many, the clock time of the
        first tick not played)."""
        return self._play_quiet(clock - origin, horizon, -1, origin, clock, dry)

    def quiet_condition(self, now: float) -> bool:
        """The fast path of :class:`ConditionArrived` in the quiet cycles
        (:attr:`in_quiet_cycles`): the new version is registered, and the decide step
        after it commands nothing (in Produce it holds; in Consume no branch before the
        cache end is replaceable under an eager commit, and the refill armed is not due
        yet and stays armed at the same time). Returns True, the books as :meth:`handle`
        keeps them, or False with nothing changed: :meth:`handle` it."""
        if not self.in_quiet_cycles or not self._eager:
            return False
        if self.state is State.CONSUME:
            due = self._refill_due_at(now)
            if due <= now + EPS or abs(self._armed_refill - due) > EPS:  # type: ignore[operator]
                return False
        self.events_handled += 1
        self._act_register_condition(ConditionArrived(), now, [])
        return True

    @property
    def in_quiet_cycles(self) -> bool:
        """Whether :meth:`play_quiet_cycles` may take the refill cycles from here: the
        table's quiet cycles, one chunk in flight under an eager commit (a condition then
        moves no job: it only binds its version to the next job a device starts) or under
        a lazy one with no version pending (the decide step would replan), no stall, and a
        refill in flight or armed."""
        return (self._quiet_cycles and self._max_in_flight == 1
                and (self._eager or self._latest_version == self._planned_version)
                and not self._flush and not self._adaptive and self._on_record is None
                and self._stalled_since is None
                and (len(self._running) == 1 if self.state is State.PRODUCE
                     else not self._running and self._armed_refill is not None))

    def quiet_cycle_books(self) -> tuple[int, float, float] | None:
        """What a driver that plays the quiet cycles itself, to hand them over in one
        :meth:`play_quiet_cycles`, starts from: where :attr:`in_quiet_cycles` holds (under
        a lazy commit with no version pending: the decide step would replan it) and the
        job in flight or armed is a refill of the K slots from the cache end
        (:attr:`cache_end`; each next job's the K after), (its id, when it was asked for
        (``inf``: armed, not asked for), the armed refill's due time (``nan``: in
        flight)); else None. The playhead is at :attr:`next_position`, due at
        :attr:`next_due`."""
        return (None if not self._eager and self._latest_version > self._planned_version
                else self._quiet_head())

    def _quiet_head(self) -> tuple[int, float, float] | None:
        """:meth:`quiet_cycle_books` with a version pending too (under an eager commit,
        :attr:`in_quiet_cycles` allows one): the first job of the cycles
        :meth:`play_quiet_cycles` may take from here, or None."""
        if not self.in_quiet_cycles:
            return None
        if self._running:
            job = self._running[0]
            if job.kind != "refill" or self._cache_end != job.branch:
                return None
            return job.job_id, job.submitted, math.nan
        if self._cache_end != self._planned_end:
            return None
        return self._next_job_id, math.inf, self._armed_refill  # type: ignore[return-value]

    def play_quiet_cycles(self, ticks: Sequence[float],
                          jobs: Sequence[tuple[float, float, float, float]]) -> int:
        """Many refill cycles with no condition arriving as one step (a driver that knows
        their times: the bulk engine's arrays), the books and records as the events would
        leave them, where :attr:`in_quiet_cycles` holds: each job's start and end, the
        wake-ups, and the ticks, their slots and the conditions they show.

        ``jobs``: from the refill in flight (or the one armed) on, each job's (asked,
        start, done, due): when it was asked for, a device started it (after a wait where
        later than asked) and it was done (``inf``: not by the end of the stretch) and the
        due time of the wake-up armed for it (``nan``: asked for at once, as a job ended).
        Every job but the last is done; the last is in flight, or armed and not asked for.
        ``ticks``: the times of the ticks played, from :attr:`next_position` on. A version
        pending binds to the first job asked for, or to the one in flight where a device
        starts it here after a wait (binding at the start); a tick that plays a newer
        version shows the conditions it resolves (:meth:`_resolve_conditions`). The driver
        vouches that these are the cycles the rows give (the times follow the due rule,
        as the arrays compute it); what is checked here is that they fit the books: the
        first job is the one in flight or armed, its chunk the next after the cache end
        (each next job's the K slots after it: job ``j``'s chunk begins at ``j·K + d``,
        ``d`` the offset a replan left), and every tick plays a chunk done by then. Under a
        lazy commit the ticks lock what they play, as ``_play_slot`` locks it.

        Returns the first job's id, or 0 with nothing changed where the books do not
        fit."""
        head = self._quiet_head() if jobs else None
        if head is None:
            return 0
        K, running, inf = self._K, self._running, math.inf
        first, asked_first, armed = head
        if jobs[0][0] != asked_first if running else jobs[0][3] != armed:
            return 0
        offset = self._cache_end - first * K  # a replan's: job j's chunk from j·K + offset
        last = len(jobs) - 1
        position, count = self._next_pos, len(ticks)
        upto = position + count
        for index in range(last):  # every job but the last done, its first slot after
            asked, _, done, _ = jobs[index]
            place = (first + index) * K + offset - position
            if done == inf or asked == inf or 0 <= place < count and ticks[place] < done:
                return 0
        if jobs[last][2] != inf:
            return 0  # the last in flight or armed
        cache_end = (first + last) * K + offset
        if upto > cache_end:
            return 0  # a tick before its chunk
        latest = self._latest_version
        # each job's version: every job asked for here takes the newest; the one in flight
        # keeps its own, unless a device starts it here after a wait (JobStarted binds it)
        lowest = 1 if running else 0  # the jobs from here on are asked for here, if at all
        bound = last > lowest or last == lowest and jobs[last][0] != inf
        first_version = latest
        if running:
            job = running[0]
            asked, start, _, _ = jobs[0]
            if self._bind_at_start and asked < start < inf and job.t_start != start:
                job.version = latest
                bound = True
            first_version = job.version
        cache = self._cache
        old_end = self._cache_end
        split = min(upto, old_end)
        entries = [cache.pop(p) for p in range(position, split)]
        # the slots not cached before: the first job's (its version), then later ones'
        in_first = max(0, min(upto, (first + 1) * K + offset) - split)
        later = split + in_first  # the first slot of a later job (latest), if before upto
        # the ticks that play a newer version: where a condition open may show (the new
        # slots change version only where a job's run of them begins)
        changes = []
        if self._open:
            shown = self._played_version
            for tick, (version, job_id) in zip(ticks, entries, strict=False):
                if version != shown:
                    changes.append((tick, version, job_id))
                    shown = version
            if split < later and first_version != shown:
                changes.append((ticks[split - position], first_version, first))
                shown = first_version
            if later < upto and latest != shown:
                changes.append((ticks[later - position], latest, (later - offset) // K))
        change, records, next_id = 0, self.jobs, self._next_job_id
        for index in range(last + 1):
            asked, start, done, due = jobs[index]
            job_id = first + index
            if job_id >= next_id and asked != inf:  # asked for here
                next_id = job_id + 1
                self.jobs_started += 1
                self.events_handled += 1 if due == due else 0  # a wake-up, if armed
            if index == last:
                break
            while change < len(changes) and changes[change][0] < done:  # ticks before it
                if self._open:
                    self._resolve_conditions(changes[change][1], changes[change][2],
                                             changes[change][0])
                change += 1
            waited = start > asked  # JobStarted moves its start
            self.events_handled += 2 if waited else 1
            branch = job_id * K + offset
            records.append(JobRecord(job_id, "refill", branch, K,
                                     first_version if index == 0 else latest, branch,
                                     start if waited else asked, done))
            if self._forget_jobs and len(records) >= FORGET_JOBS_AT:
                # the chunks cached as it was done: from the ticks played by then (those
                # after it: later), whose first slot's job is the oldest kept
                played = position + bisect_left(ticks, done)
                oldest = (entries[played - position][1] if played < split
                          else (played - offset) // K)
                records[1:] = [j for j in records[1:] if j.job_id >= oldest]
        self._next_job_id = next_id
        self.jobs_done += last
        for tick, version, job_id in changes[change:]:
            if self._open:
                self._resolve_conditions(version, job_id, tick)
        for p in range(max(old_end, upto), cache_end):
            job_id = (p - offset) // K
            cache[p] = (first_version if job_id == first else latest, job_id)
        self._cache_end = cache_end
        if self._eager:
            self._locked_end = cache_end
        elif ticks:  # what the last tick played locks (_play_slot's rule)
            self._locked_end = max(self._locked_end, ((upto - 1) // self._q + 1) * self._q)
        if ticks:
            self._log_quiet_slots(position, upto, ticks, entries, split, later,
                                  first_version, latest, offset)
            self._played_version = (latest if later < upto else first_version if split < upto
                                    else entries[-1][0])
            self._next_pos = upto
            self._next_due = ticks[-1] + self._delta
            self.played += len(ticks)
            self.slots_played_ahead += len(ticks)
        if bound:
            self._planned_version = latest
        asked, start, _, due = jobs[last]
        job_id = first + last
        if math.isinf(asked):  # armed, not asked for yet
            self._running = []
            self._live = 0
            self._planned_end = cache_end
            self._armed_refill = due
            self.state = State.CONSUME
        else:
            if not running or running[0].job_id != job_id:
                branch = job_id * K + offset
                self._running = running = [_RunningJob(job_id, "refill", branch, latest,
                                                       asked, branch)]
            if asked < start < math.inf:
                running[0].t_start = start
            self._live = 1
            self._planned_end = cache_end + K
            self._armed_refill = None
            self.state = State.PRODUCE
        self._rows = self._dispatch[self.state]
        return first

    def _log_quiet_slots(self, position: int, upto: int, ticks: Sequence[float],
                         entries: list[tuple[int, int]], split: int, later: int,
                         first_version: int, latest: int, offset: int) -> None:
        """The slot log of :meth:`play_quiet_cycles`'s ticks: positions ``position`` to
        ``upto``, those before ``split`` as ``entries`` cached them, the new ones the
        first job's (``first_version``) until ``later``, then ``latest`` (slot ``p`` of
        job ``(p - offset) // K``). A tally counts them in one step: only the prebuffer's
        slots (those before K) have job id 0, and they are cached from the start (never
        new here)."""
        K = self._K
        if self._fold_slots:
            tally = self.slots
            before = bisect_left(ticks, tally.end)  # type: ignore[attr-defined]
            zeros = 0 if position >= K else [job_id for _, job_id in entries[:before]].count(0)
            tally.add_counts(len(ticks), before, before - zeros)  # type: ignore[attr-defined]
            return
        versions = [entry[0] for entry in entries] + [first_version] * (later - split) + [
            latest] * (upto - later)
        job_ids = [entry[1] for entry in entries] + [(p - offset) // K
                                                     for p in range(split, upto)]
        for column, values in zip(self._columns,
                                  (range(position, upto), versions, job_ids, ticks), strict=True):
            column.extend(values)  # type: ignore[attr-defined]

    def _play_quiet(self, t: float, horizon: float, most: int, origin: float | None = None,
                    clock: float = 0.0, dry: bool = False) -> tuple[int, float]:
        """Play quiet ticks from the next slot on, the first at ``t`` and each next one
        ``delta`` later (or on the shifted clock of :meth:`play_quiet_shifted`), while
        before ``horizon`` (and at most ``most``, unless negative): see
        :meth:`play_ahead`. Returns how many, and the time the first tick not played is
        due (on the shifted clock, if any)."""
        shifted = origin is not None
        if origin is None:
            clock, origin = t, 0.0
        if self._stalled_since is not None:
            return 0, clock
        check = self._quiet_decide[self.state]
        if check is None:
            return 0, clock
        pending = self._latest_version > self._planned_version
        decide = check == "consume"
        if check == "produce":
            if self._flush and pending:
                return 0, clock  # the flush replan's guard is not mirrored: tick by tick
            decide, pending = self._live < self._max_in_flight, False
        armed = self._armed_refill
        if decide and armed is None:
            return 0, clock  # the decide step would arm a refill
        armed_at = math.nan if armed is None else armed  # read only when deciding
        slowly = self._on_record is not None  # records to hand out as they are made
        if slowly and (shifted or dry):
            raise ValueError("a controller that hands out its records plays tick by tick")
        cache, delta, q, eager = self._cache, self._delta, self._q, self._eager
        positions, versions, job_ids, starts = self._columns
        shown, locked, cache_end = self._played_version, self._locked_end, self._cache_end
        planned_end, refill_lead = self._planned_end, self._refill_lead  # no job starts here
        first_open = self._open[0].version if self._open else -1
        position = first = self._next_pos
        end = position + most if most >= 0 else math.inf
        while clock < horizon and position < end:
            entry = cache.get(position)
            if entry is None:
                break
            version = entry[0]
            if shifted and version != shown and 0 <= first_open <= version:
                break  # it shows a condition: the driver plays it as a tick
            playing_locks = locked
            if not eager:  # what playing it locks
                lock = (position // q + 1) * q
                if lock > locked:
                    playing_locks = lock
            after = t + delta
            if decide:  # the decide step from the state this play would leave
                if pending and self._replan_branch(t, position + 1, after, playing_locks,
                                                   cache_end, self._start_at_cache_end
                                                   ) is not None:
                    break
                # _refill_due_from(position + 1, after), inlined (a call a tick): the same sums
                due = after + (planned_end - (position + 1)) * delta - refill_lead
                if due <= t + EPS or abs(armed_at - due) > EPS:
                    break
            locked = playing_locks
            if dry:
                shown = version
            elif slowly:  # one _play_slot each: it emits the slot's record
                self._play_slot(t)
                position, t = self._next_pos, self._next_due
                clock = t
                continue
            else:
                del cache[position]
                job_id = entry[1]
                if version < shown:
                    raise AssertionError("the version on screen must never decrease")
                if version != shown and self._open:  # a condition shows at the first slot
                    self._resolve_conditions(version, job_id, t)  # of a version at least
                    first_open = self._open[0].version if self._open else -1  # its own
                shown = version
                positions.append(position)
                versions.append(version)
                job_ids.append(job_id)
                starts.append(t)
                self._next_due = after
            position += 1
            if shifted:  # the driver's sum, now + max(0, due + origin - now)
                ahead = after + origin - clock
                if ahead > 0.0:
                    clock += ahead
                t = clock - origin
            else:
                t = clock = after
        played = position - first
        if not played or slowly or dry:  # _play_slot kept the books
            return played, clock
        if self._fold_slots and len(starts) >= FOLD_AT:
            self.slots.fold()  # type: ignore[attr-defined]
        self._played_version = shown
        if not eager:
            self._locked_end = locked
        self._next_pos = position
        self.played += played
        return played, clock

    def finish(self, now: float) -> None:
        """End of run: close an open stall and record unresolved conditions as censored."""
        if self._stalled_since is not None:
            self._emit(StallRecord(self._next_pos, self._stalled_since, now, True))
            self._stalled_since = None
        for cond in self._open:
            self._emit(ConditionRecord.censored(cond.version, cond.t_arrival))
        self._open = []

    # ------------------------------------------------------------ read-only views

    @property
    def latest_version(self) -> int:
        return self._latest_version

    @property
    def next_position(self) -> int:
        return self._next_pos

    @property
    def next_due(self) -> float:
        """When the slot of :attr:`next_position` is due (if the player is not stalled)."""
        return self._next_due

    @property
    def locked_end(self) -> int:
        return self._locked_end

    @property
    def cache_end(self) -> int:
        return self._cache_end

    @property
    def cached_positions(self) -> dict[int, tuple[int, int]]:
        """Ready, unplayed positions -> (version, job_id). A copy."""
        return dict(self._cache)

    @property
    def running_job(self) -> int | None:
        """The oldest job in flight (the only one, with one chunk in flight)."""
        return self._running[0].job_id if self._running else None

    @property
    def jobs_in_flight(self) -> tuple[int, ...]:
        """Every job running, flushed ones included, oldest first."""
        return tuple(job.job_id for job in self._running)

    @property
    def live_jobs(self) -> tuple[int, ...]:
        """The jobs in flight whose output will be kept (not flushed), oldest first."""
        return tuple(job.job_id for job in self._running if job.flushed_by is None)

    @property
    def planned_end(self) -> int:
        """The first position neither cached nor due from a live job in flight: where the
        next refill branches."""
        return self._planned_end

    @property
    def lead(self) -> float:
        """The planning lead the next job is planned with (s): the config's, or with an
        adaptive lead (:class:`~latsim.controller.config.AdaptiveLead`), where the waits
        seen so far have moved it."""
        return self._lead

    @property
    def refill_lead(self) -> float:
        """How long before its first slot is due a refill starts (s): the lead plus the
        config's run-ahead."""
        return self._refill_lead

    @property
    def wait_estimate(self) -> float:
        """What an adaptive lead adds to its cost part (s): the running quantile of the
        waits; with a fixed lead, the lead."""
        return self._wait_estimate

    @property
    def open_conditions(self) -> int:
        return len(self._open)

    @property
    def stalled(self) -> bool:
        return self._stalled_since is not None

    def playable_until(self, now: float) -> float:
        """When the player would run out of ready content if nothing new arrived: the
        projected start of the first position not cached (``now`` while stalled). Minus
        ``now`` it is the stream's playout slack, which ``least-slack`` scheduling reads."""
        return self._slot_start(self._cache_end, now)

    # ------------------------------------------------------------ timing helpers

    def _slot_start(self, position: int, now: float) -> float:
        """Projected start of ``position``'s slot given the current playhead and stall."""
        base = now if self._stalled_since is not None else self._next_due
        return base + (position - self._next_pos) * self._delta

    def _refill_due_at(self, now: float) -> float:
        if self._stalled_since is not None:
            return self._refill_due_from(self._next_pos, now)
        return self._refill_due_from(self._next_pos, self._next_due)

    def _refill_due_from(self, next_pos: int, next_due: float) -> float:
        """When the refill is due, with the playhead at ``next_pos`` due at ``next_due``
        (the same sums as :meth:`_slot_start`, so :meth:`play_ahead` gets the same bits).
        The refill branches at the planned end: the cache end when nothing is in flight."""
        return next_due + (self._planned_end - next_pos) * self._delta - self._refill_lead

    # ------------------------------------------------------------ actions on events

    def _act_register_condition(self, event: ConditionArrived, now: float, out: list) -> None:
        self._latest_version += 1
        self._open.append(_OpenCondition(self._latest_version, now))

    def _act_play_or_stall(self, event: SlotDue, now: float, out: list) -> None:
        if event.position != self._next_pos or self._stalled_since is not None:
            return  # a stale tick (already played, or already stalling)
        if self._next_pos in self._cache:
            self._play(now, out)
        else:
            self._stalled_since = now

    def _act_forget_due_refill(self, event: WakeUp, now: float, out: list) -> None:
        if self._armed_refill is not None and self._armed_refill <= now + EPS:
            self._armed_refill = None

    def _find_job(self, job_id: int, what: str) -> _RunningJob:
        for job in self._running:
            if job.job_id == job_id:
                return job
        raise RuntimeError(f"{what} for job {job_id}, but it is not running")

    def _act_note_job_start(self, event: JobStarted, now: float, out: list) -> None:
        job = self._find_job(event.job_id, "job_started")
        job.t_start = now
        if self._bind_at_start and job.flushed_by is None and self._rebinds(job):
            # the device starts it now: it carries the newest version known now (DESIGN §6)
            job.version = self._latest_version
            self._planned_version = self._latest_version

    def _rebinds(self, job: _RunningJob) -> bool:
        """Whether ``job`` may take the newest version at its start: nothing behind it (a
        later branch: a live job in flight, or positions a job that ended first cached)
        carries an older one, so the versions along the positions never decrease. Under
        discard on-ready a replan's landing discards the old future cached behind it."""
        latest, end = self._latest_version, job.branch + self._K
        return (all(other.flushed_by is not None or other.branch < job.branch
                    or other.version >= latest
                    for other in self._running if other is not job)
                and ((job.kind == "replan" and self._discard_on_ready)
                     or all(version >= latest for position, (version, _)
                            in self._cache.items() if position >= end)))

    def _guard_last_job(self, event: JobDone, now: float) -> JobDone | None:
        return event if len(self._running) == 1 else None

    def _act_finish_job(self, event: JobDone, now: float, out: list) -> None:
        self._finish_job(event.job_id, now, out)

    def _finish_job(self, job_id: int, now: float, out: list) -> None:
        job = self._find_job(job_id, "job_done")
        self._running.remove(job)
        self.jobs_done += 1
        if self._adaptive:
            self._adapt_lead(job.t_start - job.submitted)
        record = JobRecord(job.job_id, job.kind, job.branch, self._K, job.version,
                           job.context, job.t_start, now)
        if job.flushed_by is not None:  # its positions were given up when it was flushed
            self.discarded += self._K
            self._emit(DiscardRecord(job.job_id, job.branch, self._K, now, job.flushed_by))
            self._emit(record)
            return
        self._live -= 1
        first = job.branch
        end = job.branch + self._K
        if self._discard_on_ready and job.kind == "replan":
            # the old future played on while the replan ran (and got locked as it played):
            # the replacement takes over from the first position still replaceable
            keep = max(job.branch, self._locked_end, self._next_pos)
            self._discard(range(keep, self._cache_end), now, job.version)
            first = min(keep, end)
            if first > job.branch:  # positions the old content filled meanwhile
                self.discarded += first - job.branch
                self._emit(DiscardRecord(job.job_id, job.branch, first - job.branch, now,
                                         job.version))
            end = max(end, keep)
        cache, entry = self._cache, (job.version, job.job_id)
        for position in range(first, job.branch + self._K):
            cache[position] = entry
        if self._discard_on_ready:
            self._cache_end = end
        elif first <= self._cache_end:  # the chunk next in line (jobs may end out of order)
            self._cache_end = end
            while self._cache_end in self._cache:  # chunks behind it that ended first
                self._cache_end += 1
        if not self._live:
            self._planned_end = self._cache_end
        if self._eager:
            self._locked_end = max(self._locked_end, self._cache_end)
        self._emit(record)
        if self._forget_jobs and len(self.jobs) >= FORGET_JOBS_AT:
            self._forget_done_jobs()
        if self._stalled_since is not None and self._next_pos in self._cache:
            if now - self._stalled_since > EPS:  # shorter ones are float rounding, not stalls
                self._emit(StallRecord(self._next_pos, self._stalled_since, now, False))
            self._stalled_since = None
            self._play(now, out)

    def _adapt_lead(self, wait: float) -> None:
        """One wait sample moves the adaptive lead's estimate one quantile step, for the
        jobs planned from now on."""
        if wait > self._wait_estimate:
            self._wait_estimate += self._lead_up
        else:
            self._wait_estimate = max(0.0, self._wait_estimate - self._lead_down)
        self._plan_with(self._lead_cost + self._wait_estimate)

    def _plan_with(self, lead: float) -> None:
        """Plan the jobs from now on with ``lead``: a refill starts ``lead`` (plus the
        config's run-ahead) before its slot is due, a replan branches at least ``lead``
        (and the commit lead) ahead."""
        self._lead = lead
        self._refill_lead = lead + self.config.run_ahead  # the lead itself when 0
        self._branch_lead = max(lead, self.config.policy.commit_lead)

    def _play(self, now: float, out: list) -> None:
        pos = self._next_pos
        version, job_id = self._play_slot(now)
        out.append(PlaySlot(pos, version, job_id, now))
        out.append(ScheduleWakeUp(self._next_due, SlotDue(pos + 1)))

    def _play_slot(self, now: float) -> tuple[int, int]:
        """Play the next position now (it is cached): the books, without commands."""
        pos = self._next_pos
        version, job_id = self._cache.pop(pos)
        if version < self._played_version:
            raise AssertionError("the version on screen must never decrease")
        self._played_version = version
        self.played += 1
        if not self._eager:
            self._locked_end = max(self._locked_end, (pos // self._q + 1) * self._q)
        if self._on_record is None:
            self.slots.add(pos, version, job_id, now)
        else:
            self._emit(SlotRecord(pos, version, job_id, now))
        if self._open:
            self._resolve_conditions(version, job_id, now)
        self._next_pos = pos + 1
        self._next_due = now + self._delta
        return version, job_id

    def _resolve_conditions(self, version: int, job_id: int, now: float) -> None:
        if self._open[0].version > version:
            return
        job = self._job_record(job_id)
        still_open = []
        for cond in self._open:
            if cond.version <= version:
                self._emit(
                    ConditionRecord.shown(
                        cond.version, cond.t_arrival, job, now, superseded=cond.version < version
                    )
                )
            else:
                still_open.append(cond)
        self._open = still_open

    def _forget_done_jobs(self) -> None:
        """Keep the prebuffer's record (its K) and those of jobs with positions cached: a
        condition resolves only to the job of a slot it plays, and those are all cached."""
        cached = {job_id for _, job_id in self._cache.values()}
        self.jobs[1:] = [job for job in self.jobs[1:] if job.job_id in cached]

    def _job_record(self, job_id: int) -> JobRecord:
        # jobs finish in id order with a single worker; search from the end
        for rec in reversed(self.jobs):
            if rec.job_id == job_id:
                return rec
        raise KeyError(job_id)

    # ------------------------------------------------------------ dispatch

    def _fire(self, rows: tuple[_Row, ...], event: Event | None, now: float, out: list) -> None:
        """Fire the first of ``rows`` whose guard holds (see :class:`Transition`)."""
        for _, guard, action, target, target_rows in rows:
            if guard is None:
                action(self, event, now, out)
            else:
                value = guard(self, event, now)
                if value is None:
                    continue
                action(self, value, now, out)
            self.state = target
            self._rows = target_rows
            return
        trigger = "Decide" if event is None else type(event).__name__
        held = " (no guard holds)" if rows else ""
        raise RuntimeError(f"no transition for {trigger} in {self.state.value}{held}: {event!r}")

    def _decide(self, now: float, out: list) -> None:
        """The decide step; again after each job it starts, while another may start at
        once (several chunks in flight fill in one instant: each start is one row)."""
        while True:
            rows = self._rows.get(Decide)
            if rows is None:
                return
            started = self.jobs_started
            self._fire(rows, None, now, out)
            if self.jobs_started == started or self._live >= self._max_in_flight:
                return

    # ------------------------------------------------------------ the decision step

    def _guard_replan_feasible(self, event: None, now: float) -> int | None:
        """Branch position for a replan, or None. DESIGN §2: the first slot starting at or
        after ``now + lead``, aligned to ``q`` and not committed, and before the cache end:
        there must be a replaceable future to replace.

        A branch that would land at (or past) the cache end replaces nothing, so no job starts
        early: the refill, due when that position is ``lead`` away, picks up the newest
        version and the condition shows at the same slot. Starting early would only occupy
        the single worker and make a condition arriving moments later wait a whole C (the
        paper's FSM: a pending version alone does not start a job). The cost is in the
        split, not in L: such a condition waits in R instead of Q (see
        :func:`latsim.analysis.theory.speculative_residual_wait_mean`)."""
        if self._latest_version <= self._planned_version:
            return None
        if self._stalled_since is not None:
            return None  # the cache is empty at the playhead: only a refill helps
        return self._replan_branch(now, self._next_pos, self._next_due, self._locked_end,
                                   self._cache_end, self._start_at_cache_end)

    def _replan_branch(self, now: float, next_pos: int, next_due: float, locked_end: int,
                       end: int, clamp: bool = False) -> int | None:
        """The replan guard's branch for a playhead at ``next_pos`` due at ``next_due``, if
        it falls before ``end`` (there is a future there to replace); one at or past it is
        ``end`` itself with ``clamp`` (``replan_at_cache_end="start"``), else None."""
        ahead = (now + self._branch_lead - next_due) / self._delta
        position = next_pos + max(0, math.ceil(ahead - EPS))
        position = max(position, locked_end, next_pos)
        position = -(-position // self._q) * self._q
        if position < end:
            return position
        return end if clamp else None

    def _guard_refill_due(self, event: None, now: float) -> int | None:
        return self._planned_end if self._refill_due_at(now) <= now + EPS else None

    def _act_start_replan(self, branch: int, now: float, out: list) -> None:
        if not self._discard_on_ready:
            self._discard(range(branch, self._cache_end), now, self._latest_version)
            self._cache_end = branch
        self._start_job("replan", branch, now, out)

    def _guard_flush_replan_feasible(self, event: None, now: float) -> int | None:
        """The flush policy's replan in Produce: the replan guard's branch, moved past any
        live chunk in flight it falls inside (a chunk is flushed whole or plays whole), and
        before the planned end."""
        if (not self._flush or self._latest_version <= self._planned_version
                or self._stalled_since is not None):
            return None
        branch = self._replan_branch(now, self._next_pos, self._next_due, self._locked_end,
                                     self._planned_end)
        if branch is None:
            return None
        for job in self._running:
            if job.flushed_by is None and job.branch < branch < job.branch + self._K:
                branch = job.branch + self._K
        return branch if branch < self._planned_end else None

    def _act_start_flush_replan(self, branch: int, now: float, out: list) -> None:
        version = self._latest_version
        # the cached future from the branch on, a chunk that ended out of order included
        self._discard(sorted(p for p in self._cache if p >= branch), now, version)
        self._cache_end = min(self._cache_end, branch)
        for job in self._running:
            if job.flushed_by is None and job.branch >= branch:
                job.flushed_by = version
                self._live -= 1
        self._start_job("replan", branch, now, out)

    def _guard_refill_due_in_flight(self, event: None, now: float) -> int | None:
        return self._guard_refill_due(event, now) if self._live < self._max_in_flight else None

    def _guard_room_in_flight(self, event: None, now: float) -> bool | None:
        return True if self._live < self._max_in_flight else None

    def _act_hold(self, value: object, now: float, out: list) -> None:
        pass

    def _discard(self, positions: Iterable[int], now: float, by_version: int) -> None:
        """Drop the cached ``positions`` (in order): one record per job they came from."""
        dropped: dict[int, list[int]] = {}
        for pos in positions:
            _, job_id = self._cache.pop(pos)
            dropped.setdefault(job_id, []).append(pos)
        for job_id, positions in dropped.items():
            self.discarded += len(positions)
            self._emit(DiscardRecord(job_id, positions[0], len(positions), now, by_version))

    def _act_start_refill(self, branch: int, now: float, out: list) -> None:
        self._start_job("refill", branch, now, out)

    def _act_arm_refill(self, value: object, now: float, out: list) -> None:
        due = self._refill_due_at(now)
        if self._armed_refill is None or abs(self._armed_refill - due) > EPS:
            self._armed_refill = due
            out.append(ScheduleWakeUp(due, WakeUp()))

    def _start_job(self, kind: str, branch: int, now: float, out: list) -> None:
        out.append(self._new_job(kind, branch, now))

    def _new_job(self, kind: str, branch: int, now: float) -> StartJob:
        """Start a job: the books, and the command that starts it."""
        job_id = self._next_job_id
        self._next_job_id += 1
        self._planned_version = self._latest_version
        self._armed_refill = None
        self._running.append(_RunningJob(job_id, kind, branch, self._latest_version, now,
                                         branch))
        self._live += 1
        self._planned_end = branch + self._K
        self.jobs_started += 1
        return StartJob(job_id, kind, branch, self._K, self._latest_version, branch)

    def _emit(self, record: object) -> None:
        self._tables[type(record)].append(record)
        if self._on_record is not None:
            self._on_record(record)


#: The decide rows :meth:`Controller.play_ahead` knows how to keep quiet, in order, by the
#: check it makes for them.
_QUIET_DECIDE_ACTIONS = {
    ("start_replan", "start_refill", "arm_refill"): "consume",
    ("start_flush_replan", "start_refill", "arm_refill", "hold"): "produce",
}

# A compiled row: (row, guard, action, target state, target state's rows by trigger). The
# methods are resolved once here, so handle() does no name lookups and allocates nothing.
_Row = tuple[Transition, Any, Any, State, dict[type, tuple[Any, ...]]]
_Dispatch = dict[State, dict[type, tuple[_Row, ...]]]


def _compile(table: Sequence[Transition], cls: type[Controller]) -> _Dispatch:
    """Rows by state and trigger, in table order, with ``cls``'s guards and actions bound."""
    dispatch: _Dispatch = {state: {} for state in State}
    for row in table:
        guard = None if row.guard is None else getattr(cls, "_guard_" + row.guard)
        action = getattr(cls, "_act_" + row.action)
        for state in _sources(row):
            rows = dispatch[state].get(row.trigger, ())
            if rows and rows[-1][1] is None:
                raise ValueError(f"unreachable: {row} follows an unguarded row for "
                                 f"{row.trigger.__name__} in {state.value}")
            target = state if row.target is None else row.target
            dispatch[state][row.trigger] = (*rows, (row, guard, action, target, dispatch[target]))
    return dispatch


Controller._dispatch = _compile(TRANSITIONS, Controller)
#: Whether the table has the rows :meth:`Controller.quiet_wake`,
#: :meth:`Controller.quiet_job_started`, :meth:`Controller.quiet_job_done`,
#: :meth:`Controller.quiet_condition` and :meth:`Controller.play_quiet_cycles` stand in for
#: (else those never take the fast path).
Controller._quiet_cycles = (
    tuple((r[0].guard, r[0].action) for r in Controller._dispatch[State.CONSUME][WakeUp])
    == ((None, "forget_due_refill"),)
    and tuple((r[0].guard, r[0].action, r[3])
              for r in Controller._dispatch[State.PRODUCE][JobDone])[:1]
    == (("last_job", "finish_job", State.CONSUME),)
    and tuple(r[0].action for r in Controller._dispatch[State.CONSUME][Decide])
    == ("start_replan", "start_refill", "arm_refill")
    and tuple(r[3] for r in Controller._dispatch[State.CONSUME][Decide])[:2]
    == (State.PRODUCE, State.PRODUCE)
    and tuple((r[0].guard, r[0].action) for r in Controller._dispatch[State.PRODUCE][JobStarted])
    == ((None, "note_job_start"),)
    and tuple(r[0].action for r in Controller._dispatch[State.PRODUCE][Decide])
    == ("start_flush_replan", "start_refill", "arm_refill", "hold")
    and all(tuple((r[0].guard, r[0].action, r[3]) for r in rows[ConditionArrived])
            == ((None, "register_condition", state),)
            for state, rows in Controller._dispatch.items()))
Controller._quiet_decide = {
    state: "none" if Decide not in rows else _QUIET_DECIDE_ACTIONS.get(
        tuple(r[0].action for r in rows[Decide]))
    for state, rows in Controller._dispatch.items()
}
