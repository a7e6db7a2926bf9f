"""A package that passes its sha256 checks is still data (trust round 2): its JSON files are read one bounded,
strict way (runtime/jsonfile.py), labels.json has a schema, and the manifest is held to the tokenizer's piece count
and the ONNX graph's inputs. Every defect is one PackageError line and `edgekit verify` exit 2, never a traceback.
Most cases use test_package's hand-made package; the piece count and the intent count use a built one, opened on
both runtimes."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from edgekit.runtime import Predictor
from edgekit.runtime.jsonfile import LABELS_BYTES, MANIFEST_BYTES, MAX_DEPTH
from edgekit.runtime.package import Package, PackageError

from ..conftest import REPO
from .test_package import INPUTS, onnx_graph, spm_model, verify, write_package


def resign(root) -> None:
    """Each listed file's sha256 and size written back into the manifest, so that the checks reach the parsers."""
    m = json.loads((root / "manifest.json").read_text())
    for name in m["files"]:
        data = (root / name).read_bytes()
        m["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "manifest.json").write_text(json.dumps(m, indent=1))


def edit_manifest(root, edit) -> None:
    m = json.loads((root / "manifest.json").read_text())
    edit(m)
    (root / "manifest.json").write_text(json.dumps(m, indent=1))


def refused(root, words: str, runtimes=()) -> None:
    """Package.load (and Predictor.open on each of `runtimes`) raise one PackageError line holding `words`;
    `edgekit verify` exits 2 with one `error:` line and no traceback."""
    for open_ in [Package.load] + [lambda r, rt=rt: Predictor.open(r, rt) for rt in runtimes]:
        with pytest.raises(PackageError) as e:
            open_(root)
        assert words in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)
    out = verify(root)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.startswith("error:") and words in out.stderr


# -- the manifest's and labels.json's text ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["manifest.json", "labels.json"])
def test_100k_nested_brackets_are_refused_without_recursion(tmp_path, name):
    """Was a RecursionError (exit 1): json's C parser recurses once per `[`."""
    root = write_package(tmp_path / "p")
    (root / name).write_text("[" * 100_000)
    if name != "manifest.json":
        resign(root)
    refused(root, f"{name}:1: arrays and objects nested more than {MAX_DEPTH} deep")


def test_nesting_is_counted_outside_strings_only(tmp_path):
    root = write_package(tmp_path / "p")
    edit_manifest(root, lambda m: m.update(profile="[" * 1000 + "{" * 1000))  # brackets in a string: not nesting
    assert Package.load(root).manifest["profile"].startswith("[[[")
    nested = "x"
    for _ in range(MAX_DEPTH):  # inside the manifest's own object: one level too deep
        nested = [nested]
    edit_manifest(root, lambda m: m.update(profile=nested))
    refused(root, f"arrays and objects nested more than {MAX_DEPTH} deep")
    with pytest.raises(PackageError) as e:
        Package.load(root)
    line = int(str(e.value).split("manifest.json:")[1].split(":")[0])  # the line of the bracket one too deep
    assert (root / "manifest.json").read_text().splitlines()[line - 1].strip() == "["
    edit_manifest(root, lambda m: m.update(profile=nested[0]))  # as deep as may be: the schema's turn
    refused(root, "manifest.json: profile: [[[")


@pytest.mark.parametrize("name,text,words", [
    ("manifest.json", None, "duplicate key 'max_len'"),  # the top level
    ("manifest.json", '"pad": 0, "pad": 0,', "duplicate key 'pad'"),  # inside tokenizer.special_ids
    ("labels.json", '{"intents": ["a", "b"], "intents": ["b", "a"], "slot_tags": ["O"]}', "duplicate key 'intents'"),
])
def test_duplicate_keys_are_refused(tmp_path, name, text, words):
    """Were accepted, the last one winning (another parser takes the first: two readings of one package)."""
    root = write_package(tmp_path / "p")
    if name == "labels.json":
        (root / name).write_text(text)
        resign(root)
    else:
        raw = (root / name).read_text()
        raw = raw.replace('"max_len": 16,', '"max_len": 512, "max_len": 16,') if text is None else \
            raw.replace('"pad": 0,', text)
        (root / name).write_text(raw)
    refused(root, words)


@pytest.mark.parametrize("number,words", [("1e400", "1e400 is out of the range of a double"),
                                          ("9" * 5000, "Exceeds the limit (4300 digits)")])
def test_numbers_python_reads_leniently_are_refused(tmp_path, number, words):
    """1e400 was read as inf (a timeout_s of inf passed the schema); an integer of 5000 digits was a ValueError
    traceback."""
    root = write_package(tmp_path / "p")
    raw = (root / "manifest.json").read_text().replace('"timeout_s": 0.3', f'"timeout_s": {number}')
    (root / "manifest.json").write_text(raw)
    refused(root, words)


def test_a_54_mb_manifest_is_refused_from_its_size_in_under_a_second(tmp_path):
    """500k `files` entries (54 MB) took 39 s to be refused: now its size alone refuses it, before reading."""
    root = write_package(tmp_path / "p")
    m = json.loads((root / "manifest.json").read_text())
    entry = {"sha256": "0" * 64, "bytes": 1}
    m["files"].update({f"f{k:06d}.bin": entry for k in range(500_000)})
    (root / "manifest.json").write_text(json.dumps(m, indent=1))
    size = (root / "manifest.json").stat().st_size
    assert size > 50_000_000
    start = time.perf_counter()
    with pytest.raises(PackageError, match=f"{size} bytes, more than the 1 MiB"):
        Package.load(root)
    assert time.perf_counter() - start < 1.0
    out = verify(root)
    assert out.returncode == 2 and "Traceback" not in out.stderr and f"more than the 1 MiB ({MANIFEST_BYTES}" in \
        out.stderr


def test_a_labels_file_over_4_mib_is_refused(tmp_path):
    root = write_package(tmp_path / "p")
    (root / "labels.json").write_text(json.dumps({"intents": ["a", "b"], "slot_tags": ["O"], "pad": "x" * (4 << 20)}))
    resign(root)
    refused(root, f"more than the 4 MiB ({LABELS_BYTES} bytes) a labels file may have")


def test_a_manifest_that_links_out_of_the_folder_is_refused(tmp_path):
    """Was accepted by verify and predict: docs/guarantees.md says links out of the folder are refused."""
    root = write_package(tmp_path / "p")
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((root / "manifest.json").read_bytes())
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to(outside)
    refused(root, "manifest.json: a link that leaves the package folder")
    (root / "manifest.json").unlink()
    (root / "manifest.json").symlink_to(os.path.relpath(outside, root))  # a relative link out, too
    refused(root, "manifest.json: a link that leaves the package folder")


# -- labels.json against its schema -----------------------------------------------------------------------------


@pytest.mark.parametrize("labels,words", [
    ({"intents": [1, 2], "slot_tags": ["O"]}, "is not of type 'string'"),  # was `package ok`
    ({"intents": ["a", 2], "slot_tags": ["O"]}, "labels.json: intents.1: 2 is not of type 'string'"),
    ({"intents": ["a", None], "slot_tags": ["O"]}, "intents.1: None is not of type 'string'"),
    ({"intents": ["a", "a"], "slot_tags": ["O"]}, "intents: 'a' is given twice"),
    ({"intents": ["a", ""], "slot_tags": ["O"]}, "intents.1: '' should be non-empty"),
    ({"intents": ["a", "b"], "slot_tags": ["O", 0]}, "slot_tags.1: 0 is not of type 'string'"),
    ({"intents": ["a", "b"], "slot_tags": "O"}, "slot_tags: 'O' is not of type 'array'"),
    ({"intents": ["a", "b"], "slot_tags": ["O"], "oos_label": 5}, "oos_label: 5 is not of type 'string', 'null'"),
    ({"intents": ["a", "b"], "slot_tags": ["O"], "oos_label": "oos"}, "oos_label: 'oos' is not one of the intents"),
    ({"intents": ["a", "b"], "slot_tags": ["O"], "other": 1}, "('other' was unexpected)"),
    ({"intents": ["a", "b"]}, "'slot_tags' is a required property"),
    ({"intents": {"a": 1, "b": 2}, "slot_tags": ["O"]}, "intents: {'a': 1, 'b': 2} is not of type 'array'"),
    (["a", "b"], "labels.json: expected a JSON object, got list"),
])
def test_labels_that_are_not_names_are_refused(tmp_path, labels, words):
    """Non-string intent names passed `edgekit verify` ("package ok"), then `predict` raised a TypeError."""
    root = write_package(tmp_path / "p")
    (root / "labels.json").write_text(json.dumps(labels))
    resign(root)
    refused(root, words)


def test_a_good_labels_file_with_an_oos_label_loads(tmp_path):
    root = write_package(tmp_path / "p")
    (root / "labels.json").write_text(json.dumps({"intents": ["a", "oos"], "slot_tags": ["O"], "oos_label": "oos"}))
    edit_manifest(root, lambda m: m["decoding"].update(oos_id=1))  # the class is the rejection id (R13)
    resign(root)
    assert Package.load(root).labels["oos_label"] == "oos"


# -- the manifest against the files it describes ----------------------------------------------------------------


def _graph_edit(k: int, **change):
    return [dict(i, **change) if n == k else i for n, i in enumerate(INPUTS)]


@pytest.mark.parametrize("graph,words", [
    (_graph_edit(3, shape=[10]), "input intent_mask is int32 [10] in the graph, the manifest's inputs.3 says int32 [2]"),
    (_graph_edit(2, name="word_ids"), "the graph's inputs are ['input_ids', 'attention_mask', 'word_ids'"),
    (_graph_edit(0, dtype="bool"), "input input_ids is bool [1, 16] in the graph, the manifest's inputs.0 says int64"),
    (_graph_edit(4, shape=[1, 1]), "input reject is int32 [1, 1] in the graph"),
    (INPUTS[:4], "the graph's inputs are ['input_ids', 'attention_mask', 'word_pos', 'intent_mask'], the manifest"),
])
def test_an_onnx_graph_whose_inputs_differ_from_the_manifest_is_refused(tmp_path, graph, words):
    root = write_package(tmp_path / "p")
    (root / "model.onnx").write_bytes(onnx_graph(graph))
    resign(root)
    refused(root, words)


def test_batch_and_dynamic_dimensions(tmp_path):
    """A graph's named dimension takes any manifest number (a dynamic sequence axis); "batch" needs a named one."""
    root = write_package(tmp_path / "p")
    def shaped(*shapes):
        return [dict(i, shape=list(s)) for i, s in zip(INPUTS, shapes)]

    batch = ["batch"]
    (root / "model.onnx").write_bytes(onnx_graph(shaped(batch + ["seq"], batch + ["seq"], batch + [14], batch + [2],
                                                        batch)))
    edit_manifest(root, lambda m: m.update(inputs=shaped(batch + [16], batch + [16], batch + [14], batch + [2], batch),
                                           seq_axis="dynamic"))
    resign(root)
    assert Package.load(root).dynamic_seq
    (root / "model.onnx").write_bytes(onnx_graph(shaped([1, 16], [1, 16], [1, 14], [1, 2], [1])))
    resign(root)
    refused(root, "input input_ids is int64 [1, 16] in the graph, the manifest's inputs.0 says int64 [batch, 16]")


@pytest.mark.parametrize("data,words", [(spm_model(9), "9 pieces, the manifest's tokenizer.vocab_size says 8"),
                                        (b"spm-model-bytes", "tokenizer.model: not a SentencePiece model (")])
def test_a_tokenizer_whose_piece_count_is_not_vocab_size_is_refused(tmp_path, data, words):
    root = write_package(tmp_path / "p")
    (root / "tokenizer.model").write_bytes(data)
    resign(root)
    refused(root, words)


# -- the same on a built package, opened on both runtimes ---------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_bert):
    from tests.runtime.test_bounds import build_small  # the config other modules build: one build a session

    out = build_small(tmp_path_factory.mktemp("built"), tiny_bert)
    for report in out.glob("report.*"):
        report.unlink()
    return out


@pytest.fixture
def copy(built, tmp_path):
    root = tmp_path / "pkg"
    shutil.copytree(built, root)
    return root


def test_a_tokenizer_with_more_pieces_than_the_manifest_says_is_refused_on_both_runtimes(copy):
    """Was opened on both runtimes; an id past the model's embedding then failed inside ONNX Runtime, where
    ExecuTorch gave a clean exit 2. Now Package.load refuses it, so both open calls and `edgekit verify` do."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    tok = pb.ModelProto()
    tok.ParseFromString((copy / "tokenizer.model").read_bytes())
    n = len(tok.pieces)
    for k in range(500):
        tok.pieces.add(piece=f"extra{k}", score=-99.0)
    (copy / "tokenizer.model").write_bytes(tok.SerializeToString())
    resign(copy)
    refused(copy, f"{n + 500} pieces, the manifest's tokenizer.vocab_size says {n}", ("executorch", "onnx"))


def test_10000_intents_are_refused_by_the_graphs_inputs_on_both_runtimes(copy):
    """labels.json, label_sets and the manifest's inputs all said 10,000 intents: the graph's intent_mask is 10, and
    ONNX Runtime failed on the first utterance (ExecuTorch: a clean exit 2)."""
    labels = json.loads((copy / "labels.json").read_text())
    n = len(labels["intents"])
    labels["intents"] = [f"intent_{k}" for k in range(10_000)]
    labels["oos_label"] = None
    (copy / "labels.json").write_text(json.dumps(labels))

    def edit(m):
        m["label_sets"]["intents"] = 10_000
        m["inputs"][3]["shape"] = [10_000]
        m["decoding"]["oos_id"] = 10_000  # the reserved id after the last intent (R13)

    edit_manifest(copy, edit)
    resign(copy)
    refused(copy, f"input intent_mask is int32 [{n}] in the graph, the manifest's inputs.3 says int32 [10000]",
            ("executorch", "onnx"))


def test_non_string_intents_in_a_built_package_are_refused(copy):
    labels = json.loads((copy / "labels.json").read_text())
    labels["intents"] = list(range(len(labels["intents"])))
    (copy / "labels.json").write_text(json.dumps(labels))
    resign(copy)
    refused(copy, "labels.json: intents.", ("executorch", "onnx"))


# -- hypothesis: anything as manifest.json or labels.json loads or is one PackageError ---------------------------

FUZZ = textwrap.dedent('''
    import hashlib, json, shutil, sys
    from pathlib import Path
    from hypothesis import HealthCheck, given, settings, strategies as st
    from edgekit.runtime.package import Package, PackageError

    GOOD, WORK = Path(sys.argv[1]), Path(sys.argv[2])
    MANIFEST = json.loads((GOOD / "manifest.json").read_text())
    LABELS = json.loads((GOOD / "labels.json").read_text())
    SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70) | st.floats()
               | st.text(max_size=20) | st.sampled_from(["labels.json", "model.onnx", "../x", "batch", "onnx", ""]))
    VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=6)
                          | st.dictionaries(st.text(max_size=12) | st.sampled_from(list(MANIFEST) + list(LABELS)),
                                            kids, max_size=6), max_leaves=30)

    def paths(value, here=()):
        yield here
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for k, v in items:
            yield from paths(v, here + (k,))

    def put(value, path, new):
        if not path:
            return new
        value = json.loads(json.dumps(value))
        node = value
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = new
        return value

    def mutated(good):  # a good file with one of its values replaced (reaches the checks past the schema)
        return st.tuples(st.sampled_from(list(paths(good))), VALUES).map(lambda pv: json.dumps(put(good, *pv)))

    def raw(good):  # text no encoder writes: duplicate keys, deep nesting, huge numbers, cut or doubled text
        text = json.dumps(good)
        return st.one_of(
            st.sampled_from(sorted(good)).map(lambda k: text.replace("{", "{" + json.dumps(k) + ": 1, ", 1)),
            st.integers(0, 200_000).map(lambda n: "[" * n + "]" * (n // 2)),
            st.integers(1, 6000).map(lambda n: text.replace("2", "9" * n, 1)),
            st.sampled_from(["1e400", "-1e400", "NaN", "-Infinity", "1e-400", "\\ufeff{}", "{}", "[]", ""]),
            st.integers(0, len(text)).map(lambda n: text[:n]),
            st.binary(max_size=64).map(lambda b: b.decode("latin-1")))

    FILES = st.one_of(
        st.tuples(st.just("manifest.json"), mutated(MANIFEST) | raw(MANIFEST) | VALUES.map(json.dumps)),
        st.tuples(st.just("labels.json"), mutated(LABELS) | raw(LABELS) | VALUES.map(json.dumps)),
        st.tuples(st.sampled_from(["tokenizer.model", "model.onnx"]), st.binary(max_size=300).map(
            lambda b: b.decode("latin-1"))))
    seen = {"ok": 0, "refused": 0}

    @settings(max_examples=int(sys.argv[3]), deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(FILES)
    def load_anything(case):
        name, text = case
        root = WORK / "p"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(GOOD, root)
        (root / name).write_bytes(text.encode("utf-8", "surrogatepass"))
        if name != "manifest.json":  # re-signed, so the sha256 check lets it through to the parser
            data = (root / name).read_bytes()
            m = dict(MANIFEST, files=dict(MANIFEST["files"], **{name: {
                "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}}))
            (root / "manifest.json").write_text(json.dumps(m))
        try:
            Package.load(root)
            seen["ok"] += 1
        except PackageError as e:
            assert "\\n" not in str(e) and len(str(e)) < 400, str(e)
            seen["refused"] += 1

    load_anything()
    print(json.dumps(seen))
''')


def test_anything_as_the_packages_json_files_loads_or_is_one_package_error(tmp_path):
    """Hypothesis, 400 examples in a subprocess (a crash fails the test): random JSON values, a good file with one
    value replaced, duplicate keys, deep nesting, huge numbers, cut text and bytes, written as manifest.json or
    labels.json (or random bytes as tokenizer.model and model.onnx) of a copy of a good package, re-signed."""
    good = write_package(tmp_path / "good")
    script = tmp_path / "fuzz.py"
    script.write_text(FUZZ)
    (tmp_path / "work").mkdir()
    r = subprocess.run([sys.executable, str(script), str(good), str(tmp_path / "work"), "400"], capture_output=True,
                       text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-4000:])
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["ok"] + seen["refused"] >= 400 and seen["refused"] > 0
