"""The segment table of a `.pte`, read from its bytes (no ExecuTorch): what the loader does not check itself.

ExecuTorch's `InternalConsistency` verification checks the program's flatbuffer structure, but not that its data
segments (constant weights, delegate blobs) are where the extended header says the segment data is. A single
flipped bit in the table can turn a segment into offset 0, size 0, which loads and then crashes the process on the
first call (found by tests/runtime/test_bounds.py's byte flips). So `check_table` holds the table to what the
serializer writes (exir/_serialize/_program.py): the first segment at 0, each next one at the previous end rounded
up to the alignment (the largest power of two every offset shares), the last one ending at the segment data's end,
and the segment data after the program and inside the file.

Layout (ExecuTorch's schema/program.fbs): bytes 0-4 the root table's offset, 4-8 the file identifier, 8-40 the
extended header (magic "eh00", its length, program size, segment base offset, segment data size);
`Program.segments` is field 4 of the root table, a vector of `DataSegment {offset: uint64, size: uint64}` tables.
"""

from __future__ import annotations

import struct
from pathlib import Path

SEGMENTS_FIELD = 4  # Program: version, execution_plan, constant_buffer, backend_delegate_data, segments, ...
HEADER = 40  # bytes up to the end of the extended header
MAX_ALIGN = 1 << 16  # the largest segment alignment believed (ExecuTorch writes 128 by default)


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


def segments(program: bytes) -> list[tuple[int, int]]:
    """[(offset, size), ...] of `Program.segments`, in table order, from the program's flatbuffer bytes."""
    at = _field(program, _u(program, 0, "<I"), SEGMENTS_FIELD)
    if at is None:
        return []
    vec = at + _u(program, at, "<I")
    out = []
    for i in range(_u(program, vec, "<I")):
        item = vec + 4 + 4 * i
        table = item + _u(program, item, "<I")
        offset, size = (_field(program, table, k) for k in (0, 1))
        out.append((0 if offset is None else _u(program, offset, "<Q"), 0 if size is None else _u(program, size, "<Q")))
    return out


def _alignment(offsets: list[int]) -> int:
    """The largest power of two (up to MAX_ALIGN) that divides every offset."""
    align = MAX_ALIGN
    for x in offsets:
        while x % align:
            align //= 2
    return align


def check_table(data: bytes, file_size: int | None = None) -> list[tuple[int, int]]:
    """The segment table of a `.pte` whose first bytes (header and program, at least) are `data`, or PteError (one
    line) when it is not one the serializer writes. file_size: the whole file's size (default len(data))."""
    file_size = len(data) if file_size is None else file_size
    if data[8:12] != b"eh00":  # no extended header: then no segments either
        if len(data) >= 8 and segments(data):
            raise PteError("segments are listed but the file has no extended header")
        return []
    length, program_size, base, data_size = (_u(data, at, fmt) for at, fmt in
                                             ((12, "<I"), (16, "<Q"), (24, "<Q"), (32, "<Q")))
    if length < HEADER - 8 or not program_size <= base <= base + data_size <= file_size:
        raise PteError(f"the extended header (length {length}, program {program_size} bytes, segments at {base}, "
                       f"{data_size} bytes) does not fit the {file_size}-byte file")
    table = segments(data[:program_size])
    if data_size and not table:  # a flipped vtable entry can hide the whole table
        raise PteError(f"the header gives {data_size} bytes of segment data, the program lists no segment")
    align, end = _alignment([o for o, _ in table]), 0
    for k, (offset, size) in enumerate(table):
        if not end <= offset < end + align or (k == len(table) - 1 and offset + size != data_size):
            where = f"after segment {k - 1} (which ends at {end})" if k else "at 0"
            raise PteError(f"segment {k} (offset {offset}, {size} bytes) is not {where} and inside the {data_size} "
                           f"bytes of segment data")
        end = offset + size
    return table


def check_segments(path: str | Path | bytes) -> None:
    """PteError (one line) unless the `.pte` at `path` (or these bytes) has a segment table the serializer would
    write (reads the header and the program, not the segments)."""
    if isinstance(path, (bytes, bytearray, memoryview)):
        check_table(path)
        return
    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(HEADER)
        program_size = _u(head, 16, "<Q") if head[8:12] == b"eh00" else 0
        data = head + f.read(max(0, min(program_size, file_size) - HEADER)) if program_size else head + f.read()
    check_table(data, file_size)
