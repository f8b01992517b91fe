"""The runtime: the app object, workers, and in-process bounded consumption."""

from headrace.runtime.app import App, TaskDefinition
from headrace.runtime.bounded import consume_bounded
from headrace.runtime.context import Context
from headrace.runtime.results import Pending, RemoteWait, Result
from headrace.runtime.settings import WorkerSettings
from headrace.runtime.stats import WorkerStats
from headrace.runtime.worker import Worker

__all__ = [
    "App",
    "Context",
    "Pending",
    "RemoteWait",
    "Result",
    "TaskDefinition",
    "Worker",
    "WorkerSettings",
    "WorkerStats",
    "consume_bounded",
]
