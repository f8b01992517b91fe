"""Pure policy: gate math, aging, fair tags, retries, error classes. No I/O; time passed in."""

from headrace.policy.clock import Clock, LoopClock, ManualClock, WallClock
from headrace.policy.durations import Duration, seconds
from headrace.policy.errors import (
    ConfigError,
    ErrorClass,
    Fatal,
    HeadraceError,
    KeyConflict,
    LeaseLost,
    QueueFull,
    RateLimited,
    RemoteFailed,
    StoreError,
    StoreUnavailable,
    TaskFailure,
    Transient,
    Unavailable,
    UnknownGate,
    UnknownRecord,
    UnknownTask,
)
from headrace.policy.gate import Gate, GateConfig, GateState, GateStatistics, Refusal
from headrace.policy.rate import Rate
from headrace.policy.retry import Action, RetryDecision, RetryPolicy
from headrace.policy.tiers import Tier, aged_tier

__all__ = [
    "Action",
    "Clock",
    "ConfigError",
    "Duration",
    "ErrorClass",
    "Fatal",
    "Gate",
    "GateConfig",
    "GateState",
    "GateStatistics",
    "HeadraceError",
    "KeyConflict",
    "LeaseLost",
    "LoopClock",
    "ManualClock",
    "QueueFull",
    "Rate",
    "RateLimited",
    "Refusal",
    "RemoteFailed",
    "RetryDecision",
    "RetryPolicy",
    "StoreError",
    "StoreUnavailable",
    "TaskFailure",
    "Tier",
    "Transient",
    "Unavailable",
    "UnknownGate",
    "UnknownRecord",
    "UnknownTask",
    "WallClock",
    "aged_tier",
    "seconds",
]
