"""The ``headrace`` command."""

from headrace.cli.main import main

__all__ = ["main"]
