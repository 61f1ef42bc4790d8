"""The test suite, a package, as each of its folders is: a test module is
``tests.<folder>.test_<topic>`` (two folders may each have a ``test_run.py``) and a helper is
imported by its place, ``from tests.servers import NatsServer``,
``from tests.jetstream.js_pull_support import setup_pull``."""
