"""Types of the optional C fast path of the protocol parser (``_speedups.c``)."""

from typing import Any

def scan_messages(
    buf: bytes,
    pos: int,
    max_line: int,
    max_payload: int,
    subjects: dict[bytes, str],
    msg_type: type[Any],
    events: list[Any],
    /,
) -> tuple[int, int]: ...
