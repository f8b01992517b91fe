"""headrace against the task queues its users would pick instead, measured in one run.

Every system runs the same two tasks (`probe.py`) in worker processes started with its own
command, configured for throughput as its documentation suggests, and is fed by a producer in a
process of its own (`produce.py`). Each system is one small module with a `Peer` (`base.py`);
`harness.py` runs the cases, the same way for every system.
"""
