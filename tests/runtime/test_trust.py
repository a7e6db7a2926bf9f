"""Issue 55: the bytes that are checked are the bytes that run, and what happens around a call never crashes the
host. Each case that could kill the process runs in a child process, whose exit status is checked."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgekit.runtime import Package, Predictor
from edgekit.runtime.package import LABELS_SCHEMA_PATH, PackageError, schema

from .test_bounds import build_small
from .test_package import verify

RUNTIMES = ("executorch", "onnx")
TEXTS = ["play queen on spotify", "wake me up at 7", "what is the weather in paris tomorrow"]


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("trust"), tiny_bert)


def copy_of(pkg, tmp_path):
    """A copy of the module's package that a test may change."""
    return Path(shutil.copytree(pkg, tmp_path / "p"))


def child(code: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter with `args` as sys.argv[1:]: a crash there is an exit status here."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


# -- a file changed under an open Predictor -------------------------------------------------------------------

CHANGE = """
    import json, os, shutil, sys
    from edgekit.runtime import Predictor
    from edgekit.runtime.package import PackageError

    root, runtime, case, name = sys.argv[1:]
    texts = json.loads(sys.argv[5]) if len(sys.argv) > 5 else ["play queen on spotify", "wake me up at 7"]
    p = Predictor.open(root, runtime)
    before = [p.predict(t) for t in texts]
    f = os.path.join(root, name)
    data = open(f, "rb").read()
    if case == "truncate":
        os.truncate(f, len(data) // 3)
    elif case == "overwrite":  # in place: same inode, same size, other bytes
        with open(f, "r+b") as fh:
            fh.write(bytes(reversed(data)))
    elif case == "copy":  # as cp does: the same inode truncated, then written
        other = f + ".other"
        open(other, "wb").write(data[len(data) // 2:] + data[: len(data) // 2])
        shutil.copyfile(other, f)
    elif case == "swap":  # another file renamed over it
        open(f + ".new", "wb").write(b"\\0" * len(data))
        os.replace(f + ".new", f)
    try:
        after = [p.predict(t) for t in texts]
        print(json.dumps({"same": after == before}))
    except PackageError as e:
        print(json.dumps({"package_error": str(e)}))
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize("case", ["truncate", "overwrite", "copy", "swap"])
def test_a_model_changed_under_an_open_predictor_changes_no_answer_and_never_kills_the_process(pkg, tmp_path, runtime,
                                                                                                case):
    root = copy_of(pkg, tmp_path)
    model = {"executorch": "model.pte", "onnx": "model.onnx"}[runtime]
    r = child(CHANGE, root, runtime, case, model)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # SIGBUS was -7, SIGSEGV -11 (issue 55)
    assert json.loads(r.stdout.splitlines()[-1]) == {"same": True}, r.stdout


@pytest.mark.parametrize("name", ["tokenizer.model", "labels.json"])
def test_the_tokenizer_and_labels_changed_under_an_open_predictor_change_no_answer(pkg, tmp_path, name):
    root = copy_of(pkg, tmp_path)
    for case in ("truncate", "swap"):
        r = child(CHANGE, root, "executorch", case, name)
        assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1]) == {"same": True}, r.stderr[-2000:]
        (root / name).write_bytes((pkg / name).read_bytes())


# -- the digest pin covers the bytes that run -----------------------------------------------------------------

PINNED = """
    import sys
    from edgekit.runtime import Package, Predictor
    from edgekit.runtime.package import PackageError

    root, runtime, model = sys.argv[1:]
    pkg = Package.load(root)
    f = root + "/" + model
    data = open(f, "rb").read()
    open(f, "wb").write(bytes(reversed(data)))  # swapped between Package.load and Predictor.open
    for target in (pkg, root):
        try:
            Predictor.open(target, runtime, digest=pkg.digest).predict("play queen")
            print("answered")
        except PackageError as e:
            print("refused:", e)
"""


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_pinned_open_refuses_a_model_swapped_after_load_never_aborts(pkg, tmp_path, runtime):
    root = copy_of(pkg, tmp_path)
    r = child(PINNED, root, runtime, {"executorch": "model.pte", "onnx": "model.onnx"}[runtime])
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])  # a reversed .pte was SIGABRT
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(x.startswith("refused:") and "sha256 differs" in x for x in lines), r.stdout


def test_a_swapped_onnx_model_never_answers_under_the_pin(pkg, tmp_path):
    """A valid but different graph (every weight doubled) put in place after Package.load: refused, not run."""
    import onnx
    from onnx import numpy_helper

    root = copy_of(pkg, tmp_path)
    loaded = Package.load(root)
    g = onnx.load(root / "model.onnx")
    init = next(i for i in g.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    onnx.save(g, root / "model.onnx")
    import onnxruntime as ort

    ort.InferenceSession(str(root / "model.onnx"))  # the swapped graph is a valid model: only the pin refuses it
    for target in (loaded, root):
        with pytest.raises(PackageError, match="model.onnx: sha256 differs"):
            Predictor.open(target, "onnx", digest=loaded.digest)


# -- many threads opening at once -----------------------------------------------------------------------------

THREADS = """
    import json, os, sys, threading
    from edgekit.runtime import Predictor

    root, n = sys.argv[1], int(sys.argv[2])
    texts = ["play queen on spotify", "wake me up at 7"]
    barrier, out, errors = threading.Barrier(n), [None] * n, []

    def work(k):
        try:
            barrier.wait()
            p = Predictor.open(root, ("executorch", "onnx")[k % 2])
            out[k] = [p.predict(t) for t in texts]
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ref = {rt: [Predictor.open(root, rt).predict(t) for t in texts] for rt in ("executorch", "onnx")}
    os.write(2, b"fd2-still-here\\n")
    print("stderr-still-here", file=sys.stderr, flush=True)
    right = all(out[k] == ref[("executorch", "onnx")[k % 2]] for k in range(n))
    print(json.dumps({"errors": errors, "right": right}))
"""


def test_sixteen_threads_opening_at_once_neither_hang_nor_lose_stderr(pkg):
    """16 threads x 20 processes (the pool is set once a process: each run starts fresh), two at a time."""
    def run(_):
        try:
            return child(THREADS, pkg, 16, timeout=180)
        except subprocess.TimeoutExpired:
            return None

    with ThreadPoolExecutor(2) as ex:
        runs = list(ex.map(run, range(20)))
    assert all(r is not None for r in runs), "a run hung"
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
        assert "fd2-still-here" in r.stderr and "stderr-still-here" in r.stderr
        assert json.loads(r.stdout.splitlines()[-1]) == {"errors": [], "right": True}


# -- ExecuTorch's threads -------------------------------------------------------------------------------------

POOL = """
    import sys
    from edgekit.runtime import Predictor
    from edgekit.runtime.backends import executorch_native

    root = sys.argv[1]
    p = Predictor.open(root, "executorch", threads=2)
    print(p.threads, executorch_native()._threadpool_get_thread_count())
    print(Predictor.open(root, "executorch").threads)  # no threads: the pool as it is
    try:
        Predictor.open(root, "executorch", threads=1)
    except ValueError as e:
        print(e)
    print(Predictor.open(root, "onnx", threads=2).threads)
"""


def test_threads_are_honoured_on_executorch_or_refused_in_one_line(pkg):
    r = child(POOL, pkg)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[:2] == ["2 2", "2"]
    assert lines[2].startswith("threads: ExecuTorch's thread pool is process-wide and holds 2") and lines[3] == "2"


RACE = """
    import sys, threading
    from edgekit.runtime import Predictor

    root, got = sys.argv[1], {}
    barrier = threading.Barrier(2)

    def work(n):
        barrier.wait()
        try:
            got[n] = Predictor.open(root, "executorch", threads=n).threads
        except ValueError as e:
            got[n] = str(e)[:40]

    threads = [threading.Thread(target=work, args=(n,)) for n in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sorted(got.items(), key=lambda kv: isinstance(kv[1], str)))
"""


def test_two_first_opens_asking_other_thread_counts_at_once_get_theirs_or_a_refusal(pkg):
    """The pool is set and the program loaded in one hold of the lock: no open is silently given another count."""
    for _ in range(3):
        r = child(RACE, pkg)
        assert r.returncode == 0, r.stderr[-2000:]
        (won, count), (lost, why) = eval(r.stdout.strip())
        assert count == won and why == "threads: ExecuTorch's thread pool is pro", r.stdout


# -- limits checked before the work ---------------------------------------------------------------------------


def test_verify_refuses_an_8_gib_sparse_file_from_its_size_in_under_a_second(pkg, tmp_path):
    root = copy_of(pkg, tmp_path)
    m = json.loads((root / "manifest.json").read_text())
    with open(root / "model.onnx", "r+b") as f:
        f.truncate(8 << 30)  # sparse: no disk used
    t0 = time.perf_counter()
    with pytest.raises(PackageError, match=f"model.onnx: {8 << 30} bytes, the manifest says"):
        Package.load(root)
    assert time.perf_counter() - t0 < 1.0
    t0 = time.perf_counter()  # the same through `edgekit verify`, a real process (its start included)
    out = verify(root)
    assert out.returncode == 2 and "bytes, the manifest says" in out.stderr and time.perf_counter() - t0 < 15
    with open(root / "model.pte", "ab") as f:  # listed first, and 8 GiB too: no file is hashed before all sizes
        f.truncate(8 << 30)
    (root / "model.onnx").write_bytes((pkg / "model.onnx").read_bytes())
    t0 = time.perf_counter()
    with pytest.raises(PackageError, match=f"model.pte: {8 << 30} bytes"):
        Package.load(root)
    assert time.perf_counter() - t0 < 1.0
    (root / "model.pte").write_bytes((pkg / "model.pte").read_bytes())
    with open(root / "model.onnx", "r+b") as f:
        f.truncate(8 << 30)
    m["files"]["model.onnx"]["bytes"] = 8 << 30  # the manifest agrees: refused from the manifest alone
    (root / "manifest.json").write_text(json.dumps(m))
    t0 = time.perf_counter()
    with pytest.raises(PackageError, match="files.model.onnx.bytes: 8589934592, more than the"):
        Package.load(root)
    assert time.perf_counter() - t0 < 1.0
    out = verify(root)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


# -- the docs and the code agree ------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_nul_alone_says_nothing_and_nul_inside_a_word_is_dropped(pkg, runtime):
    """The pre-tokenizer drops U+0000 like every control character; SentencePiece's compiled table cannot, so the
    runtime removes it (docs/guarantees.md: only control or invisible characters answer oos, confidence 0)."""
    p = Predictor.open(pkg, runtime)
    for text in ("\x00", "\x00\x00 \x00", "\u200b\x00"):
        assert p.predict(text) == p.predict("") | {"tags": ["O"] * len(text.split())}
    same = ("intent", "confidence", "tags")
    assert [p.predict("play\x00 queen")[k] for k in same] == [p.predict("play queen")[k] for k in same]
    assert p.tokenizer.encode("pl\x00ay", p.max_len).input_ids == p.tokenizer.encode("play", p.max_len).input_ids


def test_the_labels_schemas_say_which_versions_they_cover_and_the_old_one_is_unchanged():
    new, old = schema(LABELS_SCHEMA_PATH), LABELS_SCHEMA_PATH.with_name("labels-3.schema.json")
    assert new["$id"] == "https://edgekit.dev/schemas/labels/4.json" and "2, 3 and 4" in new["title"]
    # the file under labels/3.json as it was published (R1: a schema never changes under its $id)
    assert hashlib.sha256(old.read_bytes()).hexdigest() == LABELS_3_SHA256
    assert {k: v for k, v in schema(old).items() if k not in ("$id", "title")} == \
        {k: v for k, v in new.items() if k not in ("$id", "title")}


LABELS_3_SHA256 = "1161e4940221e531da15915b14323dd1a8400851e64e1c97aa905152708165c4"
