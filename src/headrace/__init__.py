"""headrace: a durable scheduler for bursty media pipelines.

import headrace as hr

app = hr.App("sqlite:///studio.db")
app.gate("provider:video", concurrency=2, rate=hr.Rate(20, per="1m"))
"""

from headrace.policy import (
    ConfigError,
    ErrorClass,
    Fatal,
    Gate,
    GateConfig,
    GateStatistics,
    HeadraceError,
    KeyConflict,
    LeaseLost,
    QueueFull,
    Rate,
    RateLimited,
    RemoteFailed,
    RetryPolicy,
    StoreError,
    StoreUnavailable,
    TaskFailure,
    Tier,
    Transient,
    Unavailable,
)
from headrace.policy.retention import Retention
from headrace.runtime import (
    App,
    Context,
    Pending,
    RemoteWait,
    Result,
    TaskDefinition,
    Worker,
    WorkerSettings,
    consume_bounded,
)
from headrace.store.protocol.types import GroupReport, TaskRecord, TaskState

__all__ = [
    "App",
    "ConfigError",
    "Context",
    "ErrorClass",
    "Fatal",
    "Gate",
    "GateConfig",
    "GateStatistics",
    "GroupReport",
    "HeadraceError",
    "KeyConflict",
    "LeaseLost",
    "Pending",
    "QueueFull",
    "Rate",
    "RateLimited",
    "RemoteFailed",
    "RemoteWait",
    "Result",
    "Retention",
    "RetryPolicy",
    "StoreError",
    "StoreUnavailable",
    "TaskDefinition",
    "TaskFailure",
    "TaskRecord",
    "TaskState",
    "Tier",
    "Transient",
    "Unavailable",
    "Worker",
    "WorkerSettings",
    "consume_bounded",
]
__version__ = "0.1.0"
