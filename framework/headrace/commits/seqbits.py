"""Sequence sets above a floor as bitmasks: the commit state's form for what is committed but
not yet contiguous.

Several workers on one pull consumer do not get runs of the stream: the server hands its
messages to their pull requests in turn, so each worker's batch is every n-th sequence, and
until every worker's batch of a region has committed, the committed set above the floor is
made of as many intervals as there are messages in flight. As intervals that is megabytes of
JSON and quadratic merges; as a bitmask (bit ``i`` is sequence ``base + i``) it is ``span / 8``
bytes whatever the pattern, compresses to little (the pattern repeats), and union,
intersection and "how far from the floor is it contiguous" are single operations on Python's
big integers, done in C.
"""

from __future__ import annotations

import base64
import re
import zlib

from headrace.commits.seqset import SeqSet

_NONZERO = re.compile(rb"[^\x00]+")


def mask_of(seqs: SeqSet, base: int) -> int:
    """The bitmask of the sequences of ``seqs`` at or above ``base`` (bit 0 is ``base``)."""
    last = seqs.last
    if last is None or last < base:
        return 0
    intervals = [(max(a, base) - base, b - base) for a, b in seqs.intervals if b >= base]
    if len(intervals) == 1:
        first, end = intervals[0]
        return ((1 << (end - first + 1)) - 1) << first
    bits = bytearray((last - base) // 8 + 1)
    for first, end in intervals:
        _set_bits(bits, first, end)
    return int.from_bytes(bits, "little")


def _set_bits(bits: bytearray, first: int, end: int) -> None:
    """Set bits ``first`` to ``end`` (inclusive) of the little-endian ``bits``."""
    lo_byte, hi_byte = first >> 3, end >> 3
    lo_mask = (0xFF << (first & 7)) & 0xFF
    hi_mask = 0xFF >> (7 - (end & 7))
    if lo_byte == hi_byte:
        bits[lo_byte] |= lo_mask & hi_mask
        return
    bits[lo_byte] |= lo_mask
    if hi_byte > lo_byte + 1:
        bits[lo_byte + 1 : hi_byte] = b"\xff" * (hi_byte - lo_byte - 1)
    bits[hi_byte] |= hi_mask


def seqset_of(mask: int, base: int) -> SeqSet:
    """The sequences a bitmask holds (bit 0 is ``base``)."""
    result = SeqSet()
    if not mask:
        return result
    data = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    pairs: list[tuple[int, int]] = []
    run_start = -1
    run_end = -2
    for found in _NONZERO.finditer(data):
        offset = found.start() * 8
        for i, byte in enumerate(found.group()):
            position = offset + i * 8
            if byte == 0xFF:
                if run_end != position - 1:
                    if run_start >= 0:
                        pairs.append((run_start, run_end))
                    run_start = position
                run_end = position + 7
                continue
            for bit in range(8):
                if byte >> bit & 1:
                    seq = position + bit
                    if run_end != seq - 1:
                        if run_start >= 0:
                            pairs.append((run_start, run_end))
                        run_start = seq
                    run_end = seq
    if run_start >= 0:
        pairs.append((run_start, run_end))
    return SeqSet((a + base, b + base) for a, b in pairs)


def trailing_ones(mask: int) -> int:
    """How many of the lowest bits are set, in a row."""
    return (~mask & (mask + 1)).bit_length() - 1


def encode(mask: int) -> str:
    """The stored form: the little-endian bytes, deflated, base64 (empty for no bits)."""
    if not mask:
        return ""
    raw = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def decode(text: str) -> int:
    """The bitmask of :func:`encode`'s form; ``ValueError`` if it is not one."""
    if not text:
        return 0
    try:
        raw = zlib.decompress(base64.b64decode(text.encode("ascii"), validate=True))
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"not an encoded bitmask: {exc}") from None
    return int.from_bytes(raw, "little")
