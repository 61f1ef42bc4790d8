"""Moved to :mod:`headrace.protocol.server_errors` (the sans-IO session classifies ``-ERR``).

Kept so that old imports work through this release; importing it warns.
"""

from __future__ import annotations

import warnings

from headrace.protocol.server_errors import classify, is_terminal

warnings.warn(
    "headrace.nats.server_errors moved to headrace.protocol.server_errors",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["classify", "is_terminal"]
