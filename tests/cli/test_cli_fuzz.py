"""The CLI's options fuzzed by their types (hypothesis), in-process through `edgekit.cli.main` so torch is imported
once, in a child process per runtime: a crash (an abort in a runtime) must show as a failed test, not end pytest.

Every call must end as the CLI promises: exit 0, or exit 2 with one `error:` line (or Click's usage error), never
a traceback or another exit code."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import DEMO, need_module
from tests.runtime.test_bounds import build_small

EXAMPLES = 300
CHILD = r'''
import contextlib, io, json, os, sys
from hypothesis import HealthCheck, given, settings, strategies as st
from edgekit.cli import main

PKG, DATA, RUNTIME, N = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
LABELS = json.load(open(os.path.join(PKG, "labels.json")))["intents"]
junk = st.one_of(st.text(max_size=12), st.sampled_from(["", "-1", "0", "1", "2.5", "nan", "inf", "-inf", "1e309",
                                                        "none", "[]", "{}", "\x00", "--", "-", "é", "a" * 300]))
num = st.one_of(st.integers(-3, 400).map(str), st.floats(allow_nan=True).map(str), junk)
intents = st.one_of(st.lists(st.sampled_from(LABELS), min_size=0, max_size=3).map(",".join), junk)
runtime = st.one_of(*[st.just(RUNTIME)] * 6, junk)
text = st.one_of(st.text(max_size=60), st.sampled_from(["play queen", "wake me up at 6", " ", "\u200b"]))
path = st.one_of(*[st.just(PKG)] * 6, junk, st.just(DATA), st.just("/"))
split = st.one_of(st.sampled_from(["train", "dev", "test", "all"]), junk)
fmt = st.one_of(st.sampled_from(["jsonl", "csv", "jointbert", "clinc", "split-files"]), junk)


def opt(name, values):
    """An optional option: absent, or `--name value`."""
    return st.one_of(st.just([]), values.map(lambda v: [name, v]))


def flag(name):
    return st.sampled_from([[], [name]])


def command(name, *parts):
    return st.tuples(*parts).map(lambda ps: [name] + [a for p in ps for a in p])


predict = command("predict", path.map(lambda p: [p]), text.map(lambda t: [t]), opt("--runtime", runtime),
                  flag("--tags"), opt("--allow-intents", intents), flag("--no-reject"),
                  opt("--escalate-below", num), opt("--fallback", st.sampled_from(["http://127.0.0.1:9", "x", ""])))
verify = command("verify", path.map(lambda p: [p]), opt("--digest", junk))
evaluate = command("eval", path.map(lambda p: [p]), st.just(["--data", DATA]), opt("--runtime", runtime),
                   opt("--split", split.filter(lambda s: s != "all")), opt("--format", fmt),
                   opt("--allow-intents", intents), flag("--no-reject"), flag("--no-compare-eager"))
bench = command("bench", path.map(lambda p: [p]), st.just(["--data", DATA]), opt("--runtime", runtime),
                opt("--n", st.sampled_from(["0", "-1", "3", "x"])), opt("--threads", st.sampled_from(["0", "-2", "1"])),
                opt("--batch", st.sampled_from(["0", "1,x", "", "2"])), opt("--provider", st.sampled_from(["cpu", "gpu"])))
profile = command("profile", path.map(lambda p: [p]), st.just(["--data", DATA]), opt("--runtime", runtime),
                  opt("--n", st.sampled_from(["0", "2", "x"])), opt("--threads", st.sampled_from(["0", "1"])),
                  opt("--format", fmt), st.just(["--out", "profile.json"]))
# a build whose data does not exist: every setting is checked (and refused or passed) before the data is read, so
# no example trains
setting = st.one_of(st.sampled_from(["teacher.epochs=2", "distill.alpha=0.5", "budget.intent_drop_pts=nan",
                                     "teacher.epochs=-1", "package.max_len=4", "server.batch=true", "nope.x=1",
                                     "teacher=1", "=", "serve.max_batch=0", "compress.vocab_budget=none"]), junk)
build = command("build", st.just(["--data", "missing-data", "--out", "out"]),
                opt("--target", st.one_of(st.sampled_from(["android", "ios", "web", "server-cpu", "server-gpu"]), junk)),
                opt("--set", setting), opt("--set", setting), opt("--stages", st.one_of(
                    st.sampled_from(["teacher,export,package", "export", "teacher,package,export"]), junk)),
                opt("--intents", junk), opt("--seed", num), opt("--format", fmt), opt("--config", junk),
                opt("--base-model", junk), flag("--strict"))
other = st.one_of(st.just(["targets"]), st.lists(junk, max_size=3), command("cache", st.sampled_from([["ls"],
                  ["prune"], ["prune", "--older-than", "-1"], ["nope"]])))
# well-formed calls with fuzzed text and intents: the answering path, not only the refusals
answer = command("predict", st.just(["--runtime", RUNTIME]), flag("--tags"),
                 opt("--allow-intents", st.lists(st.sampled_from(LABELS), min_size=1, max_size=3).map(",".join)),
                 flag("--no-reject"), text.map(lambda t: ["--", PKG, t]))  # `--`: a text may start with a dash
argv = st.one_of(answer, answer, answer, predict, predict, predict, verify, evaluate, bench, profile, build, other)
seen = {}


@settings(max_examples=N, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(argv)
def test(args):
    sys.argv = ["edgekit", *args]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    said = err.getvalue() + out.getvalue()
    assert "Traceback" not in said, (args, said[-2000:])
    assert code in (0, 2), (args, code, said[-2000:])
    if code == 2 and said.lstrip().startswith("error:"):
        assert said.strip().count("\n") == 0 or "Usage:" in said, (args, said)  # one line
    seen[code] = seen.get(code, 0) + 1


test()
print(json.dumps({"examples": sum(seen.values()), "exit_codes": seen}))
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory, tiny_bert):
    return build_small(tmp_path_factory.mktemp("fuzz_pkg"), tiny_bert)  # test_bounds' config: one build a session


@pytest.mark.parametrize("runtime", ["executorch", "onnx"])
def test_cli_options_fuzzed_by_type_never_crash(package, runtime, tmp_path):
    need_module("hypothesis", "hypothesis (the dev extra)")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CHILD, str(package), str(DEMO), runtime, str(EXAMPLES)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:] + r.stdout[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["examples"] >= EXAMPLES
    assert summary["exit_codes"].get("0") and summary["exit_codes"].get("2")  # both paths were exercised
