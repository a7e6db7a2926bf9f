"""The runtime's argument contract (trust round 2): `Predictor.open`, `predict` and `predict_batch` check every
argument's type, shape and range before any tensor is made. Only InputError (a ValueError: text), ValueError,
TypeError and PackageError leave the API, each one line naming the parameter, and nothing a caller passes can abort
the process.

The calls that could abort (a reject of the wrong shape reached ExecuTorch's tensor_ptr.cpp assert: SIGABRT) run
in a child process, one per runtime, so that a crash is a failed test and not a dead pytest; so does hypothesis,
over the arguments' types. The package is test_bounds.py's, built once for the module (the stage cache makes the
second build in a session a copy)."""

import hashlib
import json
import logging
import reprlib
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgekit.runtime import PackageError, Predictor
from edgekit.runtime.tokenizer import InputError

from ..conftest import REPO
from .test_bounds import build_small

RUNTIMES = ("executorch", "onnx")
TEXTS = ["play queen on spotify", "set an alarm for 7 am", "what is the weather in paris"]
ERRORS = {"InputError": InputError, "ValueError": ValueError, "TypeError": TypeError, "PackageError": PackageError}

# case -> (the call, as the child evaluates it with `p` a Predictor of its runtime and `pkg` the package folder;
# the error it must raise; how its message starts). Issue "trust round 2" lists 1-2; the rest are their kin.
CASES = {
    # 1. a bad reject or warn: SIGABRT on ExecuTorch ([], [[]]), a PackageError blaming model.pte ([False]), ONNX
    # Runtime's raw InvalidArgument, or silently accepted (None, "no", NaN)
    "reject=[]": ("p.predict('play queen', reject=[])", TypeError, "reject: expected True or False, got []"),
    "reject=[False]": ("p.predict('play queen', reject=[False])", TypeError, "reject: expected True or False"),
    "reject=None": ("p.predict('play queen', reject=None)", TypeError, "reject: expected True or False, got None"),
    "reject='no'": ("p.predict('play queen', reject='no')", TypeError, "reject: expected True or False, got 'no'"),
    "reject=NaN": ("p.predict('play queen', reject=float('nan'))", TypeError, "reject: expected True or False, got nan"),
    "reject=0": ("p.predict('play queen', reject=0)", TypeError, "reject: expected True or False, got 0"),
    "warn='yes'": ("p.predict('play queen', warn='yes')", TypeError, "warn: expected True or False"),
    "batch reject=[[]]": ("p.predict_batch(['play queen'], reject=[[]])", TypeError, "reject[0]: expected True or"),
    "batch reject=None": ("p.predict_batch(['play queen'], reject=None)", TypeError, "reject: expected True or"),
    "batch reject short": ("p.predict_batch(['a', 'b', 'c'], reject=[True])", ValueError, "reject: 1 values for 3"),
    "batch warn=None": ("p.predict_batch(['play queen'], warn=None)", TypeError, "warn: expected True or False"),
    # 2. the batch API's silent wrong answers, and allow_intents=5's undocumented TypeError
    "batch allow short": ("p.predict_batch(['a', 'b', 'c'], allow_intents=[['play_music']])", ValueError,
                          "allow_intents: 1 entries for 3 texts"),
    "batch texts=str": ("p.predict_batch('play')", TypeError, "texts: expected a list of str, got 'play'"),
    "batch texts=bytes": ("p.predict_batch(b'play')", TypeError, "texts: expected a list of str"),
    "batch text=3": ("p.predict_batch(['ok', 3])", InputError, "texts[1]: text must be a str, got int"),
    "allow=5": ("p.predict('play queen', allow_intents=5)", TypeError, "allow_intents: expected a list of intent"),
    "allow=str": ("p.predict('play queen', allow_intents='play_music')", TypeError, "allow_intents: expected a list"),
    "allow=[5]": ("p.predict('play queen', allow_intents=[5])", TypeError, "allow_intents: intent names are str"),
    "allow=[]": ("p.predict('play queen', allow_intents=iter([]))", ValueError, "allow_intents: give a non-empty"),
    "allow unknown": ("p.predict('play queen', allow_intents=['dance'])", ValueError,
                      "allow_intents: unknown intent 'dance'"),
    "batch allow=5": ("p.predict_batch(['a'], allow_intents=5)", TypeError, "allow_intents: expected None"),
    "batch allow mixed": ("p.predict_batch(['a', 'b'], allow_intents=['play_music', None])", TypeError,
                          "allow_intents: give one list"),
    "batch allow row": ("p.predict_batch(['a', 'b'], allow_intents=[None, ['dance']])", ValueError,
                        "allow_intents[1]: unknown intent 'dance'"),
    # Predictor.open's arguments
    "open threads=0": ("Predictor.open(pkg, runtime, threads=0)", ValueError, "threads: expected 1 to 256, got 0"),
    "open threads=10**9": ("Predictor.open(pkg, runtime, threads=10**9)", ValueError, "threads: expected 1 to"),
    "open threads='2'": ("Predictor.open(pkg, runtime, threads='2')", TypeError, "threads: expected an int"),
    "open runtime=5": ("Predictor.open(pkg, 5)", TypeError, "runtime: expected one of executorch, onnx, got 5"),
    "open runtime=tflite": ("Predictor.open(pkg, 'tflite')", ValueError, "runtime: unknown runtime 'tflite'"),
    "open package=5": ("Predictor.open(5, runtime)", TypeError, "package: expected a package folder"),
    "open digest=5": ("Predictor.open(pkg, runtime, digest=5)", TypeError, "digest: expected a str or None, got 5"),
    "open providers=gpu": ("Predictor.open(pkg, runtime, providers=['gpu'])", ValueError,
                           "providers: unknown provider 'gpu'"),
    "open providers=str": ("Predictor.open(pkg, runtime, providers='cpu')", TypeError, "providers: expected a list"),
    "open spin='no'": ("Predictor.open(pkg, runtime, spin='no')", TypeError, "spin: expected True or False"),
    "open escalate_below='x'": ("Predictor.open(pkg, runtime, fallback_url='http://127.0.0.1:9', "
                                "escalate_below='x')", TypeError, "escalate_below: expected a number or None"),
    "open escalate_below=NaN": ("Predictor.open(pkg, runtime, fallback_url='http://127.0.0.1:9', "
                                "escalate_below=float('nan'))", ValueError, "escalate_below: expected a number in"),
    "open fallback_timeout_s=0": ("Predictor.open(pkg, runtime, fallback_url='http://127.0.0.1:9', "
                                  "escalate_below=0.5, fallback_timeout_s=0)", ValueError,
                                  "fallback_timeout_s: expected a number in (0, 3600], got 0"),
    "open fallback_timeout_s=10**400": ("Predictor.open(pkg, runtime, fallback_url='http://127.0.0.1:9', "
                                        "escalate_below=0.5, fallback_timeout_s=10**400)", ValueError,
                                        "fallback_timeout_s: expected a number in (0, 3600]"),
    "open a path too long": ("Predictor.open('a' * 5000, runtime)", PackageError, "a"),
    "open fallback_url=5": ("Predictor.open(pkg, runtime, fallback_url=5)", TypeError, "fallback_url: expected a"),
}



def run_cases(pkg: str, runtime: str) -> None:
    """The child's part of the plain tests: every call in CASES, one JSON line each (what it answered or raised)."""
    p = Predictor.open(pkg, runtime)
    for case, (call, _, _) in CASES.items():
        print(json.dumps({"case": case, "started": True}), flush=True)  # when the process dies, this says where
        try:
            out = eval(call, {"p": p, "Predictor": Predictor, "pkg": pkg, "runtime": runtime})
            print(json.dumps({"case": case, "answered": type(out).__name__}), flush=True)
        except Exception as e:
            print(json.dumps({"case": case, "raised": [c.__name__ for c in type(e).__mro__], "message": str(e)}),
                  flush=True)
    print("done", flush=True)


def child(function: str, *args: str) -> subprocess.Popen:
    """`function` of this module run in a child Python: a crash there is a failed test, not a dead pytest."""
    code = f"import sys; from tests.runtime.test_contract import {function}; {function}(*sys.argv[1:])"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def pkg(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("contract"), tiny_bert)


@pytest.fixture(scope="module")
def preds(pkg):
    return {rt: Predictor.open(pkg, rt) for rt in RUNTIMES}


@pytest.fixture(scope="module")
def children(pkg):
    """Both runtimes' children, started together: the case table (run_cases) and the hypothesis run (fuzz)."""
    procs = {(fn, rt): child(fn, str(pkg), rt) for fn in ("run_cases", "fuzz") for rt in RUNTIMES}
    done: dict = {}

    def result(function: str, runtime: str) -> tuple[int, str, str]:
        if (function, runtime) not in done:
            out, err = procs[function, runtime].communicate(timeout=600)
            done[function, runtime] = (procs[function, runtime].returncode, out, err)
        return done[function, runtime]

    yield result
    for proc in procs.values():
        if proc.poll() is None:  # a test failed before reading it
            proc.kill()
            proc.communicate()


def outcome(children, runtime: str, case: str) -> dict:
    """What CASES[case] did in the runtime's child; fails the test when the child died (at which case)."""
    rc, out, err = children("run_cases", runtime)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert rc == 0 and out.rstrip().endswith("done"), (f"the child died (rc {rc}) in case {lines[-1]['case']!r}"
                                                       if lines else f"the child died (rc {rc})", err[-2000:])
    return next(x for x in lines if x["case"] == case and "started" not in x)


def check_cases(children, runtime: str, cases: list[str]) -> None:
    """Each case raised its documented error, with its one-line message naming the parameter."""
    for case in cases:
        got, (_, error, message) = outcome(children, runtime, case), CASES[case]
        assert error.__name__ in got.get("raised", []), (case, got)
        # and no narrower documented type: an option's ValueError is no InputError, which the CLI reports as `text:`
        assert set(got["raised"]) & set(ERRORS) <= {c.__name__ for c in error.__mro__}, (case, got)
        assert got["message"].startswith(message) and "\n" not in got["message"], (case, got["message"])


# -- 1. a bad reject or warn is a TypeError, and never aborts the process ----------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_reject_that_is_not_a_bool_is_a_type_error_and_the_process_survives(children, runtime):
    check_cases(children, runtime, ["reject=[]", "reject=[False]", "reject=None", "reject='no'", "reject=NaN",
                                    "reject=0", "warn='yes'"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_batch_reject_of_the_wrong_type_or_length_is_refused_and_the_process_survives(children, runtime):
    check_cases(children, runtime, ["batch reject=[[]]", "batch reject=None", "batch reject short",
                                    "batch warn=None"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_numpy_bools_are_bools(preds, runtime):
    p = preds[runtime]
    assert p.predict(TEXTS[0], reject=np.bool_(False)) == p.predict(TEXTS[0], reject=False)
    rows = [True, False, True]
    assert p.predict_batch(TEXTS, reject=np.array(rows)) == p.predict_batch(TEXTS, reject=rows)


# -- 2. the batch API: no silent wrong answers -------------------------------------------------------------------


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_batch_options_must_fit_the_batch_and_texts_must_be_a_list(children, runtime):
    check_cases(children, runtime, ["batch allow short", "batch texts=str", "batch texts=bytes", "batch text=3",
                                    "batch allow=5", "batch allow mixed", "batch allow row"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_allow_intents_of_the_wrong_type_or_value_is_a_clean_error(children, runtime):
    check_cases(children, runtime, ["allow=5", "allow=str", "allow=[5]", "allow=[]", "allow unknown"])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_allow_intents_given_as_a_generator_is_read_once(preds, runtime):
    p, names = preds[runtime], ["play_music", "get_weather"]
    want = [p.predict(t, allow_intents=names, reject=False) for t in TEXTS]
    assert [p.predict(t, allow_intents=(n for n in names), reject=False) for t in TEXTS] == want
    assert all(a["intent"] in names for a in want)
    assert p.predict_batch(iter(TEXTS), allow_intents=(n for n in names), reject=False) == want
    assert p.predict_batch(TEXTS, allow_intents=[(n for n in names) for _ in TEXTS], reject=False) == want


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_one_list_of_names_or_one_entry_per_text(preds, runtime):
    p, names = preds[runtime], ["set_alarm"]
    assert p.predict_batch(TEXTS, allow_intents=names) == [p.predict(t, allow_intents=names) for t in TEXTS]
    per_text = [None, names, ("get_weather", "navigate")]
    assert p.predict_batch(TEXTS, per_text, [True, False, True]) == [
        p.predict(t, allow_intents=a, reject=r) for t, a, r in zip(TEXTS, per_text, [True, False, True])]
    assert p.predict_batch([]) == [] and p.predict_batch([], allow_intents=names) == []


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_open_refuses_arguments_of_the_wrong_type_or_value(children, runtime):
    check_cases(children, runtime, [c for c in CASES if c.startswith("open ")])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_failure_inside_the_backends_run_is_one_package_error_line(preds, runtime):
    p = preds[runtime]
    inputs = p.inputs(p.encode(TEXTS[0]))
    inputs[0] = inputs[0].astype(np.float32)  # input_ids of the wrong dtype: the runtime itself refuses the call
    with pytest.raises(PackageError) as e:
        p.backend.run(*inputs)
    assert str(e.value).startswith("model.pte: ExecuTorch" if runtime == "executorch" else "model.onnx: ONNX Runtime")
    assert "\n" not in str(e.value)


# -- hypothesis over the arguments' types, in a child per runtime ------------------------------------------------

FUZZ_EXAMPLES = 300  # per entry point (open, predict, predict_batch) and runtime
# a documented error names what was wrong: a parameter (or a package file, for a PackageError)
PARAMETERS = ("text", "allow_intents", "reject", "warn", "package", "runtime", "threads", "providers", "digest",
              "fallback_url", "escalate_below", "fallback_timeout_s", "spin")
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 30


def strategies(intents: list[str]) -> dict:
    """Arguments of any type: None, bools (numpy's too), ints of any size, floats with NaN and infinities, str,
    bytes, and lists, tuples, generators and dicts of these, nested; beside them valid intent names and texts."""
    from hypothesis import strategies as st

    def gen(xs):
        return (x for x in xs)

    atoms = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.binary(max_size=6),
                      st.sampled_from(intents), st.sampled_from([np.bool_(True), np.float64("nan"), np.int64(3)]))
    values = st.recursive(atoms, lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple), st.lists(inner, max_size=4).map(gen),
        st.dictionaries(st.text(max_size=3), inner, max_size=2)), max_leaves=10)
    names = st.lists(st.sampled_from(intents), min_size=1, max_size=3)
    texts = st.one_of(st.sampled_from(TEXTS + ["", " ", "\u200b"]), st.text(max_size=30))
    return {"values": values, "names": st.one_of(names, names.map(tuple), names.map(gen), names.map(set)),
            "texts": texts, "bools": st.one_of(st.booleans(), st.just(np.bool_(False)))}


def settles(call, answered, outcomes: dict) -> None:
    """`call()` answers (then `answered(out)` checks the answer) or raises a documented error, in one line that
    names what was wrong; anything else fails the hypothesis run. Counts the outcomes."""
    try:
        out = call()
    except (ValueError, TypeError, PackageError) as e:  # InputError is a ValueError
        msg = str(e)
        assert "\n" not in msg and (isinstance(e, PackageError) or any(p in msg for p in PARAMETERS)), repr(e)
        outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
        return
    assert answered(out), out
    outcomes["answer"] = outcomes.get("answer", 0) + 1


def fuzz(pkg: str, runtime: str) -> None:
    """The child's hypothesis run: FUZZ_EXAMPLES examples of each entry point, a SUMMARY line for each."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    logging.getLogger("edgekit.runtime").setLevel(logging.ERROR)  # truncation warnings: thousands of them
    p = Predictor.open(pkg, runtime)
    s, intents = strategies(p.labels["intents"]), p.labels["intents"]
    values = s["values"]

    def maybe(*good):  # a valid value 3 times in 4: a call with several arguments must often get through
        return st.sampled_from([0, 1, 2, 3]).flatmap(lambda k: values if k == 3 else st.one_of(*good))
    conf = settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))
    outcomes: dict = {"open": {}, "predict": {}, "predict_batch": {}}

    @conf
    @given(st.fixed_dictionaries({"text": maybe(s["texts"]), "warn": maybe(s["bools"]),
                                  "allow_intents": maybe(st.none(), s["names"]), "reject": maybe(s["bools"])}))
    def predict(kw):
        print("TRY predict", _SHORT.repr(kw), flush=True)  # the last one shows, should the process die
        settles(lambda: p.predict(**kw), lambda a: a["intent"] in intents + ["oos"], outcomes["predict"])

    @st.composite
    def batch(draw):
        rows = draw(st.lists(st.one_of(s["texts"], s["texts"], values), max_size=4))
        n = len(rows)
        texts = draw(st.sampled_from([rows, tuple(rows), iter(rows)]) | values)
        per_row = st.lists(st.one_of(st.none(), s["names"]), min_size=n, max_size=n)
        return texts, {"allow_intents": draw(maybe(st.none(), s["names"], per_row)),
                       "reject": draw(maybe(s["bools"], st.lists(s["bools"], min_size=n, max_size=n))),
                       "warn": draw(maybe(s["bools"]))}

    @conf
    @given(batch())
    def predict_batch(args):
        texts, kw = args
        n = len(texts) if isinstance(texts, (list, tuple)) else None  # a generator: any length it had
        print("TRY predict_batch", _SHORT.repr(args), flush=True)
        settles(lambda: p.predict_batch(texts, **kw),
                lambda a: isinstance(a, list) and (n is None or len(a) == n) and all(
                    x["intent"] in intents + ["oos"] for x in a), outcomes["predict_batch"])

    digest = hashlib.sha256((Path(pkg) / "manifest.json").read_bytes()).hexdigest()  # the package's digest
    options = {"threads": maybe(st.integers(1, 3), st.integers()), "providers": maybe(st.none(), st.lists(
        st.sampled_from(["cpu", "cuda", "tensorrt", "gpu"]), max_size=2)), "digest": maybe(st.none(), st.sampled_from(
            [digest, "sha256:" + digest.upper(), "0" * 64])), "fallback_url": maybe(st.none(), st.sampled_from(
                ["http://127.0.0.1:9", "ftp://x", ""])), "escalate_below": maybe(st.none(), st.floats()),
        "fallback_timeout_s": maybe(st.none(), st.floats()), "spin": maybe(s["bools"])}

    @conf
    @given(st.fixed_dictionaries({"package": maybe(st.sampled_from([pkg, Path(pkg), pkg + "/nope"])),
                                  "runtime": maybe(st.sampled_from([runtime, runtime, "tflite"]))}, optional=options))
    def open_(kw):
        print("TRY open", _SHORT.repr(kw), flush=True)
        settles(lambda: Predictor.open(**kw), lambda q: isinstance(q, Predictor), outcomes["open"])

    for name, test in (("predict", predict), ("predict_batch", predict_batch), ("open", open_)):
        t0 = time.perf_counter()
        test()
        print("SUMMARY", json.dumps({"entry": name, "examples": sum(outcomes[name].values()), "outcomes":
                                     outcomes[name], "seconds": round(time.perf_counter() - t0, 1)}), flush=True)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_any_arguments_get_an_answer_or_a_documented_error_and_the_process_survives(children, runtime):
    rc, out, err = children("fuzz", runtime)
    assert rc == 0, (rc, out.splitlines()[-2:], err[-3000:])
    summary = {x["entry"]: x for x in (json.loads(line.removeprefix("SUMMARY ")) for line in out.splitlines()
                                        if line.startswith("SUMMARY "))}
    assert set(summary) == {"open", "predict", "predict_batch"}, out[-2000:]
    for entry, x in summary.items():
        assert x["examples"] >= FUZZ_EXAMPLES, x
        assert x["outcomes"].get("answer") and len(x["outcomes"]) > 1, x  # both answers and errors were seen
