"""The readers' cost grows with the input, no faster, and is bounded: a line holds at most formats.MAX_LINE_BYTES
(checked while the file streams in), a CLINC150 JSON file (read whole) at most formats.MAX_JSON_BYTES. What is over
a limit is refused in one line naming the file, the line and the limit (docs/data-formats.md, "Limits")."""

import json
import subprocess
import sys
import time

import pytest

from edgekit.data import formats
from edgekit.data.dataset import detect_format, load_dataset
from edgekit.errors import DataError
from tests.cli.test_cli import assert_one_line_error
from tests.conftest import REPO
from tests.data.test_data import small_jointbert

MIB = 1 << 20
TOO_LONG = r"line longer than 1,048,576 bytes \(1 MiB\), the most a line may hold"


def test_limits_are_the_documented_ones():
    assert formats.MAX_LINE_BYTES == MIB and formats.MAX_JSON_BYTES == 32 * MIB
    text = (REPO / "docs" / "data-formats.md").read_text()
    assert "1 MiB" in text and "32 MiB" in text


def test_csv_header_with_100k_columns_is_read_in_under_2_s(tmp_path):
    """Was quadratic in the columns: 8k took 1.2 s, 100k did not finish in 120 s."""
    n = 100_000
    f = tmp_path / "wide.csv"
    header = ["text", "label"] + [f"c{i}" for i in range(n - 2)]  # 589 kB: under the line limit, so read
    f.write_text(",".join(header) + "\n" + "".join(f"play song {i},music" + "," * (n - 2) + "\n" for i in range(2)))
    t0 = time.perf_counter()
    ds = load_dataset(f)
    took = time.perf_counter() - t0
    assert took < 2, took
    assert sorted(ex.text for s in ds.splits.values() for ex in s) == ["play song 0", "play song 1"]
    # a column named twice among them: still found at once, and named
    f.write_text(",".join(header + ["c77"]) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"wide\.csv:1: duplicate column c77"):
        load_dataset(f)
    assert time.perf_counter() - t0 < 2


def test_csv_header_of_the_issue_100k_columns_1_2_mb_is_refused_in_under_2_s(tmp_path):
    f = tmp_path / "wide.csv"
    f.write_text("text,label," + ",".join(f"column_{i:05d}" for i in range(100_000)) + "\nhi,greet\n")
    assert f.stat().st_size > 1.2e6
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"wide\.csv:1: " + TOO_LONG):
        load_dataset(f)
    assert time.perf_counter() - t0 < 2


def _big_jsonl(path, size: int) -> None:
    """One JSONL row of `size` bytes, written a MiB at a time."""
    head, tail = b'{"text": "', b'", "intent": "x"}\n'
    with open(path, "wb") as f:
        f.write(head)
        left = size - len(head) - len(tail)
        while left > 0:
            f.write(b"a " * (min(left, MIB) // 2) + b"a" * (min(left, MIB) % 2))
            left -= MIB
        f.write(tail)


# The child writes its own peak (VmHWM of its process image) to the file named first: wait4's ru_maxrss counts the
# forking pytest worker's memory too (Linux carries it across exec), over a GB late in a test run.
HWM = ("import atexit, runpy, sys\nout = sys.argv.pop(1)\n"
       "def hwm():\n    kb = next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n"
       "    open(out, 'w').write(str(kb))\natexit.register(hwm)\n")


def _peak(args: list[str], hwm) -> tuple[int, str, int]:
    """Run a Python child (`-c CODE ARGS` or `-m MODULE ARGS`): (exit code, stderr, its peak resident bytes)."""
    flag, what, *rest = args
    code = HWM + (what if flag == "-c" else f"sys.argv[0] = {what!r}\nrunpy.run_module({what!r}, run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", code, str(hwm), *rest], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return r.returncode, r.stderr.decode(), int(hwm.read_text()) * 1024


def test_200_mb_single_line_jsonl_is_refused_in_under_1_gb(tmp_path):
    """Was read whole: 3.4 GB peak. Now refused once its first MiB streams in, by the reader and by the CLI."""
    f = tmp_path / "big.jsonl"
    _big_jsonl(f, 200 * MIB)
    code = ("import sys\nfrom edgekit.data.dataset import load_dataset\nfrom edgekit.errors import DataError\n"
            "try:\n    load_dataset(sys.argv[1])\nexcept DataError as e:\n    sys.exit(f'refused: {e}')\n")
    rc, err, peak = _peak(["-c", code, str(f)], tmp_path / "hwm1")
    assert rc == 1 and "big.jsonl:1: line longer than 1,048,576 bytes (1 MiB)" in err, err
    assert peak < 1 << 30, peak
    print(f"reader: peak {peak / MIB:.0f} MiB")
    rc, err, peak = _peak(["-m", "edgekit.cli", "build", "--data", str(f), "--out", str(tmp_path / "o")],
                          tmp_path / "hwm2")
    assert_one_line_error(subprocess.CompletedProcess([], rc, "", err), "big.jsonl:1: line longer than")
    assert peak < 1 << 30, peak
    print(f"edgekit build: peak {peak / MIB:.0f} MiB")


def test_a_line_at_the_limit_is_read_and_one_byte_more_is_refused(tmp_path):
    f = tmp_path / "d.jsonl"
    _big_jsonl(f, MIB + 1)  # the line and its \n
    ex = load_dataset(f).splits["train"][0]
    assert len(ex.words) == len(json.loads(f.read_text())["text"].split()) > 500_000 and ex.intent == "x"
    _big_jsonl(f, MIB + 2)
    with pytest.raises(DataError, match=r"d\.jsonl:1: " + TOO_LONG):
        load_dataset(f)


@pytest.mark.parametrize("where", ["csv", "tsv", "seq.in", "seq.out", "label", "split-files", "crlf", "cr"])
def test_every_line_format_refuses_a_long_line_naming_file_and_line(tmp_path, where):
    long = "w " * (MIB // 2 + 1)
    if where in ("csv", "tsv", "crlf", "cr"):
        sep = "\t" if where == "tsv" else ","
        eol = {"crlf": "\r\n", "cr": "\r"}.get(where, "\n")
        data = tmp_path / f"d.{'tsv' if where == 'tsv' else 'csv'}"
        data.write_bytes(eol.join([f"text{sep}label", f"hi{sep}greet", f"{long}{sep}greet", ""]).encode())
        name, line = data.name, 3
    elif where == "split-files":
        data = tmp_path / "folder"
        data.mkdir()
        (data / "test.csv").write_text("text,label\nhi,greet\n")
        (data / "train.jsonl").write_text('{"text": "hi", "intent": "a"}\n' + json.dumps({"text": long}) + "\n")
        name, line = "train.jsonl", 2
    else:
        data = small_jointbert(tmp_path)
        f = data / "train" / where
        lines = f.read_text().splitlines()
        lines[4] = long
        f.write_text("\n".join(lines) + "\n")
        name, line = where, 5
    with pytest.raises(DataError, match=rf"{name}:{line}: " + TOO_LONG):
        load_dataset(data)


def test_a_csv_row_whose_quoted_line_breaks_add_up_past_the_limit_is_refused(tmp_path):
    """Each line short, the row (quoted line breaks) long: csv would gather it all; the row is held to the limit."""
    f = tmp_path / "d.csv"
    f.write_text("text,label\nhi,greet\n" + ",".join(['"b\n"'] * (MIB // 4)) + "\n")  # 1.25 MiB over 262k lines
    with pytest.raises(DataError, match=r"d\.csv:3: a row over 1,048,576 bytes \(1 MiB\)"):
        load_dataset(f)


def test_clinc_json_over_its_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "MAX_JSON_BYTES", 1000)
    rows = [["what is my balance", "balance"], ["book a flight", "book_flight"]] * 30
    f = tmp_path / "data_full.json"
    f.write_text(json.dumps({"train": rows}))
    assert detect_format(tmp_path) == "clinc"
    with pytest.raises(DataError, match=r"data_full\.json: [\d,]+ bytes; a CLINC150 JSON file is read whole and "
                                        r"may hold at most 1,000 bytes"):
        load_dataset(tmp_path)


def test_one_line_clinc_json_longer_than_a_line_is_still_detected_and_read(tmp_path):
    """data_full.json on one line (json.dump writes it so) is over the line limit: that limit is for line formats."""
    rows = [[f"what is my balance {i}", "balance"] for i in range(40_000)] + [["book a flight", "book_flight"]]
    f = tmp_path / "clinc.json"
    f.write_text(json.dumps({"train": rows}))
    assert f.stat().st_size > MIB
    ds = load_dataset(f)
    assert ds.format == "clinc" and ds.intents == ["balance", "book_flight"]


@pytest.mark.parametrize("shift", range(3))
def test_a_file_over_a_mib_with_a_byte_order_mark_is_detected_wherever_its_first_mib_ends(tmp_path, shift):
    """The first MiB read for detection, a BOM at its start and a 3-byte character across its end: it was taken as
    the whole file and refused as "not valid UTF-8" (two of three offsets)."""
    rows = [["x" * shift, "book"]] + [["书" * 100, "book"], ["什么", "balance"]] * 4000
    f = tmp_path / "clinc.txt"  # a suffix that says nothing: the format is detected from the head
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"train": rows}, ensure_ascii=False).encode())
    assert f.stat().st_size > MIB
    assert detect_format(f) == "clinc"


def test_a_1_mib_jsonl_row_with_20k_slots_reads_in_under_2_s(tmp_path):
    """Tagging was slots x words: 20k spans over 40k words took minutes."""
    n = 40_000
    text = " ".join(["w"] * n)
    row = {"text": text, "intent": "x", "slots": [{"start": 4 * i, "end": 4 * i + 1, "slot": "s"} for i in range(n // 2)]}
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps(row, separators=(",", ":")) + "\n")
    assert 0.5 * MIB < f.stat().st_size < MIB
    t0 = time.perf_counter()
    ex = load_dataset(f).splits["train"][0]
    took = time.perf_counter() - t0
    assert took < 2, took
    assert ex.tags[:4] == ["B-s", "O", "B-s", "O"] and len(ex.tags) == n
