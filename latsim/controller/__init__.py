"""The core layer: stream timing, commitment policies, flat records and the sans-IO controller.

Pure logic with no simpy, numpy, torch, clock or file I/O (the run layer writes and reads
the records); every other layer builds on it.
The controller's public types are re-exported here (``from latsim.controller import
Controller, StartJob``).
"""

from latsim.controller.config import (
    BIND_MODES,
    DISCARD_MODES,
    IN_FLIGHT_POLICIES,
    MAX_IN_FLIGHT,
    REPLAN_AT_CACHE_END,
    AdaptiveLead,
    ControllerConfig,
)
from latsim.controller.machine import (
    EPS,
    EVENT_KINDS,
    TRANSITIONS,
    Command,
    ConditionArrived,
    Controller,
    Decide,
    Event,
    JobDone,
    JobStarted,
    PlaySlot,
    ScheduleWakeUp,
    SlotDue,
    StartJob,
    State,
    Transition,
    WakeUp,
    mermaid_diagram,
)

__all__ = [
    "AdaptiveLead",
    "BIND_MODES", "DISCARD_MODES", "EPS", "EVENT_KINDS", "IN_FLIGHT_POLICIES", "MAX_IN_FLIGHT",
    "REPLAN_AT_CACHE_END", "TRANSITIONS", "Command",
    "ConditionArrived", "Controller",
    "ControllerConfig", "Decide", "Event", "JobDone", "JobStarted", "PlaySlot",
    "ScheduleWakeUp", "SlotDue", "StartJob", "State", "Transition", "WakeUp",
    "mermaid_diagram",
]
