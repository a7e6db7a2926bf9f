"""The segment table of a `.pte`, read from its bytes (no ExecuTorch): what the loader does not check itself.

ExecuTorch's `InternalConsistency` verification checks the program's flatbuffer structure, but not that its data
segments (constant weights, delegate blobs) are where the extended header says the segment data is. A single
flipped bit in the table can turn a segment into offset 0, size 0, which loads and then crashes the process on the
first call (found by tests/runtime/test_bounds.py's byte flips). So `check_segments` holds the table to what the
serializer writes: segments in file order, none overlapping the next, all inside the segment data.

Layout (ExecuTorch's schema/program.fbs and exir/_serialize/_program.py): bytes 0-4 the root table's offset,
4-8 the file identifier, 8-40 the extended header (magic "eh00", its length, program size, segment base offset,
segment data size); `Program.segments` is field 4 of the root table, a vector of `DataSegment {offset: uint64,
size: uint64}` tables.
"""

from __future__ import annotations

import struct
from pathlib import Path

SEGMENTS_FIELD = 4  # Program: version, execution_plan, constant_buffer, backend_delegate_data, segments, ...


class PteError(ValueError):
    """The file's segment table is not one ExecuTorch's serializer writes."""


def _u(buf: bytes, at: int, fmt: str) -> int:
    size = struct.calcsize(fmt)
    if not 0 <= at <= len(buf) - size:
        raise PteError(f"an offset ({at}) points outside the program")
    return struct.unpack_from(fmt, buf, at)[0]


def _field(buf: bytes, table: int, k: int) -> int | None:
    """The position of table field k, or None when the table leaves it out (flatbuffers' vtable)."""
    vtable = table - _u(buf, table, "<i")
    if 4 + 2 * k >= _u(buf, vtable, "<H"):
        return None
    off = _u(buf, vtable + 4 + 2 * k, "<H")
    return table + off if off else None


def segments(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """([(offset, size), ...] in table order, segment data size) of a `.pte`'s bytes; ([], 0) for a file without
    an extended header (no segments)."""
    if data[8:12] != b"eh00":
        return [], 0
    program_size, _base, data_size = _u(data, 16, "<Q"), _u(data, 24, "<Q"), _u(data, 32, "<Q")
    buf = data[:program_size]
    root = _u(buf, 0, "<I")
    at = _field(buf, root, SEGMENTS_FIELD)
    if at is None:
        return [], data_size
    vec = at + _u(buf, at, "<I")
    out = []
    for i in range(_u(buf, vec, "<I")):
        item = vec + 4 + 4 * i
        table = item + _u(buf, item, "<I")
        offset, size = (_field(buf, table, k) for k in (0, 1))
        out.append((0 if offset is None else _u(buf, offset, "<Q"), 0 if size is None else _u(buf, size, "<Q")))
    return out, data_size


def check_segments(path: str | Path) -> None:
    """PteError (one line) unless the `.pte`'s segments follow one another, each inside the segment data."""
    table, data_size = segments(Path(path).read_bytes())
    end = 0
    for k, (offset, size) in enumerate(table):
        if offset < end or offset + size > data_size:
            raise PteError(f"segment {k} (offset {offset}, {size} bytes) is not after segment {k - 1} and inside "
                           f"the {data_size} bytes of segment data")
        end = offset + size
