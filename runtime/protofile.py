"""Facts read from a package's protobuf files by walking their fields, without the libraries that run them: the
pieces, special pieces and normalizer name of `tokenizer.model` (SentencePiece's ModelProto) and the inputs and
outputs `model.onnx` declares (ONNX's ModelProto). So `Package.load` (and `edgekit verify`, which loads no model)
can hold the manifest to both (docs/package-format.md R5, R8).

The walk is linear and iterative: length-delimited fields are skipped by their length, never copied, and a file
that is not a protobuf is a ValueError saying where it stops making sense.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

ONNX_DTYPES = {"int64": 7, "int32": 6, "float32": 1, "bool": 9}  # TensorProto.DataType of the manifest's input dtypes
_INT64 = 1 << 63


def _varint(buf, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise ValueError(f"a number runs past its message at byte {i}")
        b = buf[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


# Fields walked in one message at most: a transformer's graph has a few thousand nodes and initializers.
MAX_FIELDS = 200_000


def fields(buf, start: int = 0, end: int | None = None):
    """(number, wire type, value) of each field of the message in buf[start:end], in order: value is the int of a
    varint, else the (start, end) of the field's bytes in `buf`."""
    end = len(buf) if end is None else end
    i, count = start, 0
    while i < end:
        count += 1
        if count > MAX_FIELDS:  # the walk is Python, byte by byte: a message of millions of tiny fields would take minutes
            raise ValueError(f"more than {MAX_FIELDS:,} fields in one message")
        key, i = _varint(buf, i, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ValueError(f"field number 0 at byte {i}")
        if wire == 0:
            value, i = _varint(buf, i, end)
        else:
            if wire == 2:
                n, i = _varint(buf, i, end)
            elif wire in (1, 5):
                n = 8 if wire == 1 else 4
            else:  # 3 and 4 (groups) are not in these formats; 6 and 7 are not wire types
                raise ValueError(f"wire type {wire} at byte {i}")
            value, i = (i, i + n), i + n
            if i > end:
                raise ValueError(f"field {number} runs past its message (byte {i} of {end})")
        yield number, wire, value


def _parts(buf, spans: list[tuple[int, int]], number: int) -> list[tuple[int, int]]:
    """The spans of message field `number` in the messages at `spans` (a singular message given twice is merged
    by the protobuf rules: its parts are read in order, the last scalar winning)."""
    out = []
    for start, end in spans:
        for n, wire, value in fields(buf, start, end):
            if n == number:
                if wire != 2:
                    raise ValueError(f"field {number} is wire type {wire}, not a message")
                out.append(value)
    return out


def _text(buf, span: tuple[int, int], most: int = 256) -> str:
    """A string field, its first `most` bytes (a longer one ends in "..." and so equals no name a manifest holds)."""
    start, end = span
    text = bytes(buf[start:min(end, start + most)]).decode("utf-8", "replace")
    return text + "..." if end - start > most else text


def _scalar(buf, spans: list[tuple[int, int]], number: int, text: bool = False):
    """The last value of scalar field `number` in the messages at `spans` (None when absent)."""
    value = None
    for start, end in spans:
        for n, wire, v in fields(buf, start, end):
            if n == number and text and wire == 2:
                value = _text(buf, v)
            elif n == number and not text and wire == 0:
                value = v
    return value


class _Blocks:
    """A file as a read-only byte sequence, read in 64 KiB blocks as the walk reaches them (a model of hundreds of
    MB is read only where its fields are). Not mmap: a file cut short meanwhile would be a SIGBUS, here a
    ValueError."""

    BLOCK = 1 << 16

    def __init__(self, f):
        self.f, self.size = f, f.seek(0, 2)
        self.at, self.data = -1, b""

    def __len__(self) -> int:
        return self.size

    def _read(self, start: int, n: int) -> bytes:
        self.f.seek(start)
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("the file ended early (changed while it was read)")
        return data

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._read(i.start, i.stop - i.start)
        if not self.at <= i < self.at + len(self.data):
            self.at = i - i % self.BLOCK
            self.data = self._read(self.at, min(self.BLOCK, self.size - self.at))
        return self.data[i - self.at]


@contextmanager
def _source(src: str | Path | bytes):
    """A file's bytes as the walk reads them: bytes already in memory as they are (what a Predictor runs), a path
    through `_Blocks`."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        yield src
        return
    with open(src, "rb") as f:
        yield _Blocks(f)


def _piece(buf, start: int, end: int) -> tuple[str, int]:
    """A SentencePiece message's text (field 1, last wins, default "") and type (field 3, default 1), in one walk.
    A piece of the usual few bytes is copied out first: indexing bytes is far cheaper than `_Blocks`."""
    if end - start <= 1024:
        buf, start, end = buf[start:end], 0, end - start
    text, kind = "", 1
    for n, wire, v in fields(buf, start, end):
        if n == 1 and wire == 2:
            text = _text(buf, v)
        elif n == 3 and wire == 0:
            kind = v
    return text, kind


def sentencepiece_facts(src: str | Path | bytes, texts) -> tuple[int, str, dict[str, list[tuple[int, int]]]]:
    """What docs/package-format.md R5 checks in a SentencePiece model file: its piece count, its normalizer's name
    (NormalizerSpec field 1 in ModelProto field 3, the last value winning; "" when absent) and, for each of
    `texts`, every (id, type) of a piece with that text (SentencePiece field 1, default ""; field 3, default 1)."""
    found: dict[str, list[tuple[int, int]]] = {t: [] for t in texts}
    with _source(src) as buf:
        pieces, specs = 0, []
        for n, wire, v in fields(buf):  # one walk of the top level: pieces (1) and the normalizer spec (3)
            if n in (1, 3) and wire != 2:
                raise ValueError(f"field {n} is wire type {wire}, not a message")
            if n == 1:
                text, kind = _piece(buf, *v)
                if text in found:
                    found[text].append((pieces, kind))
                pieces += 1
            elif n == 3:
                specs.append(v)
        return pieces, _scalar(buf, specs, 1, text=True) or "", found


def _dims(buf, tensor: list[tuple[int, int]]) -> list | None:
    """TypeProto.Tensor's shape: each dim an int (dim_value), a str (dim_param) or None (unknown); None: no shape."""
    shape = _parts(buf, tensor, 2)
    if not shape:
        return None
    dims = []
    for start, end in _parts(buf, shape, 1):
        dim = None
        for n, wire, v in fields(buf, start, end):  # dim_value and dim_param are a oneof: the last one wins
            if n == 1 and wire == 0:
                dim = v - 2 * _INT64 if v >= _INT64 else v
            elif n == 2 and wire == 2:
                dim = _text(buf, v)
        dims.append(dim)
    return dims


def onnx_inputs(src: str | Path | bytes, field: int = 11) -> list[tuple[str | None, int | None, list | None]]:
    """The graph inputs an ONNX model file declares, in order: (name, elem_type, dims) each (see `_dims`).
    field 12: its outputs instead. ValueError when the file is not an ONNX ModelProto. src: a path, or the
    file's bytes."""
    with _source(src) as buf:
        graph = _parts(buf, [(0, len(buf))], 7)  # ModelProto.graph
        out = []
        for info in _parts(buf, graph, field):  # GraphProto.input (11) / output (12): ValueInfoProto {name 1, type 2}
            tensor = _parts(buf, _parts(buf, [info], 2), 1)  # TypeProto.tensor_type
            out.append((_scalar(buf, [info], 1, text=True), _scalar(buf, tensor, 1), _dims(buf, tensor)))
        return out


def onnx_outputs(src: str | Path | bytes) -> list[tuple[str | None, int | None, list | None]]:
    """The graph outputs an ONNX model file declares, as `onnx_inputs` gives its inputs."""
    return onnx_inputs(src, 12)
