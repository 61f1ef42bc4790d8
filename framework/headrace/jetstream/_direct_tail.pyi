"""Types of the optional C split of a batched Direct Get answer's server lines
(``_direct_tail.c``)."""

def split_tail(raw: bytes, /) -> tuple[int, bytes, int, int, int | None] | None: ...
