"""The command line as a user meets it: one-line errors with exit code 2, JSON answers."""

import subprocess
import sys

import pytest

from tests.conftest import DEMO


def run_process(*args):
    """`python -m edgekit.cli ARGS` in a process of its own, as a shell runs it."""
    return subprocess.run([sys.executable, "-m", "edgekit.cli", *args], capture_output=True, text=True, timeout=300)


def run(*args):
    """`edgekit ARGS` through the CLI's own entry point (edgekit.cli.main) in this process: the exit code, stdout,
    and stderr with the CLI's log lines, as a shell sees them. A process each cost ~4 s of imports (torch, the
    runtimes) and made this file the suite's third longest; `run_process` keeps the end-to-end calls."""
    import contextlib
    import logging
    import tempfile

    from edgekit.cli import main

    # files, not StringIO: code that redirects the native stderr (a runtime's C++ chatter) needs a file descriptor
    out, err = tempfile.TemporaryFile("w+", encoding="utf-8"), tempfile.TemporaryFile("w+", encoding="utf-8")
    handler = logging.StreamHandler(err)  # the CLI logs to the stderr of its start (logging.basicConfig)
    handler.setFormatter(logging.Formatter("edgekit: %(message)s"))
    log = logging.getLogger("edgekit")
    log.addHandler(handler)
    # the CLI sets these loggers' levels (options.quiet): put them back, for the tests after this one
    levels = {name: logging.getLogger(name).level for name in logging.root.manager.loggerDict}
    levels["edgekit"] = log.level
    argv, sys.argv = sys.argv, ["edgekit", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        log.removeHandler(handler)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    said = []
    for f in (out, err):
        f.seek(0)
        said.append(f.read())
        f.close()
    return subprocess.CompletedProcess(["edgekit", *args], code, *said)


def assert_one_line_error(res, *needles):
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_unknown_target(tmp_path):
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path), "--target", "toaster"),
                          "unknown --target 'toaster'", "android")


def test_version():
    from edgekit import __version__

    res = run_process("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"edgekit {__version__}"


def test_missing_package_dir(tmp_path):
    assert_one_line_error(run("predict", str(tmp_path / "nope"), "hi"), "no such package directory")
    (tmp_path / "notes.txt").write_text("hi")
    assert_one_line_error(run("verify", str(tmp_path / "notes.txt")), "notes.txt: a file, not a package folder")
    assert_one_line_error(run("doctor", str(tmp_path / "nope")), "no such package directory")  # bad input: 2


def bad_jointbert(folder):
    """A JointBERT folder whose train/seq.out line 2 has 2 tags for 3 words."""
    d = folder / "train"
    d.mkdir(parents=True)
    (d / "seq.in").write_text("a b\nc d e\n")
    (d / "seq.out").write_text("O O\nO O\n")
    (d / "label").write_text("x\ny\n")
    return folder


def test_bad_data_names_file_and_line(tmp_path):
    d = bad_jointbert(tmp_path / "data") / "train"
    assert_one_line_error(run("build", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "o")),
                          "seq.out:2:", "2 tags")
    (d / "label").unlink()
    assert_one_line_error(run("build", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "o")),
                          "label: missing split file")


@pytest.mark.parametrize("content,needle", [("", "empty"), ("just some words\n", "unknown format")])
def test_empty_or_unknown_file(tmp_path, content, needle):
    f = tmp_path / "data.txt"
    f.write_text(content)
    assert_one_line_error(run("build", "--data", str(f), "--out", str(tmp_path / "o")), str(f), needle)


def test_nothing_written_on_bad_input(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "report.json").write_text('{"kept": true}')
    res = run("build", "--data", str(tmp_path / "missing.csv"), "--out", str(out))
    assert res.returncode == 2
    assert (out / "report.json").read_text() == '{"kept": true}'


def test_predict_json_on_built_package(tmp_path, tiny_bert):
    import json

    out = tmp_path / "pkg"
    res = run_process("build", "--data", str(DEMO), "--out", str(out), "--base-model", str(tiny_bert), "--set",
              "teacher.epochs=1", "--set", "teacher.steps_limit=3", "--set", "package.buckets=[]", "--set",
              "package.bench_utterances=0", "--set", "decoding.compare_argmax=false",
              "--stages", "teacher,export,package")
    assert res.returncode == 0, res.stderr[-2000:]
    for rt, text, how in [("executorch", "😀 ¿qué?", run_process), ("executorch", "", run),
                          ("onnx", "set an alarm for 7 am", run)]:
        r = how("predict", str(out), text, "--runtime", rt)
        assert r.returncode == 0, r.stderr[-2000:]
        assert set(json.loads(r.stdout)) >= {"intent", "confidence", "slots"}
    # Checks that do not depend on the runtime use ONNX Runtime, which starts in a third of ExecuTorch's time.
    long = run("predict", str(out), "alarm " * 300, "--runtime", "onnx")
    assert long.returncode == 0 and "truncated" in long.stderr
    assert_one_line_error(run("predict", str(out), "hi", "--runtime", "tflite"), "unknown --runtime")
    allowed = json.loads((out / "labels.json").read_text())["intents"][:2]
    for rt in ("executorch", "onnx"):
        r = run("predict", str(out), "set an alarm for 7 am", "--runtime", rt, "--allow-intents", ",".join(allowed),
                "--no-reject")
        assert r.returncode == 0 and json.loads(r.stdout)["intent"] in allowed, r.stderr[-2000:]
    assert_one_line_error(run("predict", str(out), "hi", "--allow-intents", "dance", "--runtime", "onnx"),
                          "unknown intent 'dance'")
    # bench: the package against its FP32 teacher exported the same way, in one run (ONNX Runtime: exporting the
    # teacher to ExecuTorch again would double this test's time)
    b = run("bench", str(out), "--data", str(DEMO), "--n", "20", "--compare-teacher", "--runtime", "onnx",
            "--provider", "cpu")
    assert b.returncode == 0, b.stderr[-2000:]
    rep = json.loads(b.stdout)
    assert rep["package_latency"]["n"] == 60 and rep["teacher_latency"]["p50_ms"] > 0
    # the teacher it times is named: the build's own (its base model), never distill.teacher
    built = json.loads((out / "report.json").read_text())
    assert rep["teacher"] == {"base_model": built["config"]["base_model"], "stage": "teacher",
                              "params": built["stages"][0]["params"]} and rep["teacher"]["params"] > 0
    # --provider reaches the single-utterance timing, the teacher beside it too
    assert rep["provider"] == rep["teacher_provider"] == "CPUExecutionProvider"
    assert_one_line_error(run("bench", str(out), "--data", str(DEMO), "--runtime", "executorch", "--provider",
                              "cuda"), "--provider")
    assert rep["speedup_p50"] == pytest.approx(rep["teacher_latency"]["p50_ms"] / rep["package_latency"]["p50_ms"])
    assert_one_line_error(run("bench", str(tmp_path / "nope"), "--data", str(DEMO)), "nope")
    # splits: a name not known, one left empty, and `all` (a held-out file of the user's own, none drawn)
    for cmd in ("eval", "bench"):
        assert_one_line_error(run(cmd, str(out), "--data", str(DEMO), "--split", "val", "--runtime", "onnx"),
                              "unknown --split 'val'", "all")
    few = tmp_path / "few.txt"  # 2 utterances of 2 of the package's intents: no test split can be drawn
    by_intent: dict = {}
    for line in DEMO.read_text().splitlines():
        by_intent.setdefault(json.loads(line)["intent"], []).append(line)
    few.write_text("".join(f"{line}\n" for lines in list(by_intent.values())[:2] for line in lines[:2]))
    for cmd in ("eval", "bench"):
        assert_one_line_error(run(cmd, str(out), "--data", str(few), "--runtime", "onnx"), str(few),
                              "test split is empty")
    every = json.loads(run("eval", str(out), "--data", str(few), "--split", "all", "--format", "jsonl",
                           "--runtime", "onnx", "--no-compare-eager").stdout)
    assert every["n"] == 4 and every["split"] == "all", every
    b = run("bench", str(out), "--data", str(few), "--split", "all", "--format", "jsonl", "--runtime", "onnx",
            "--n", "5")
    assert b.returncode == 0 and json.loads(b.stdout)["n"] == 4, b.stderr[-2000:]
    # the cascade's flags name themselves
    assert_one_line_error(run("predict", str(out), "hi", "--escalate-below", "0.5"), "--escalate-below", "--fallback")
    assert_one_line_error(run("predict", str(out), "hi", "--fallback", "http://127.0.0.1:9", "--escalate-below",
                              "1.5"), "--escalate-below: expected a number in [0, 1], got 1.5")


def test_unknown_build_intent_is_one_line(tmp_path):
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--intents", "nope"),
                          "--intents", "'nope'")


def test_bad_settings_fail_fast_with_one_line(tmp_path):
    import time

    for setting, needles in [("distill.alpha=2", ("distill.alpha: must be in [0, 1], got 2",)),
                             ("compress.vocab_budget=100", ("compress.vocab_budget", "exceed")),
                             ("distill.alfa=0.5", ("unknown setting distill.alfa",)),
                             ("server.skip_layer_norm=false", ("server.skip_layer_norm is now fuse.skip_layer_norm",)),
                             ("teacher.epochs=many", ("teacher.epochs", "expected int")),
                             ("quantize.method=median", ("quantize:", "minmax")),
                             ("package.buckets=[2]", ("package.buckets", ">= 3")),
                             ("nosuch.key=1", ("unknown table 'nosuch'",)),
                             ("alpha=1", ("table.key=value",))]:
        t0 = time.perf_counter()
        res = run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--set", setting)
        assert time.perf_counter() - t0 < 10, setting  # before any training
        assert_one_line_error(res, *needles)
    assert not (tmp_path / "o").exists()
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--stages",
                              "teacher,fuse,export,package"), "stages run in this order")
    cfg = tmp_path / "build.toml"
    cfg.write_text("[distill]\ntemperature = -1\n")
    assert_one_line_error(run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), "--config", str(cfg)),
                          "distill.temperature")


def test_unreadable_profile_config_base_model_or_cache_is_one_line(tmp_path, tiny_bert):
    import shutil

    def build(*args):
        return run("build", "--data", str(DEMO), "--out", str(tmp_path / "o"), *args)

    prof = tmp_path / "p.toml"
    for text, needles in [('extends = "android"\nbucket_percentiles = [50, 200]\n', ("bucket_percentiles", "0 to 100")),
                          ('extends = "android"\nbench_threads = "2"\n', ("bench_threads must be int", "'2'")),
                          ('extends = 1\n', ("extends must be",)),
                          ('extends = "android"\nstages = ["teacher", 3]\n', ("stages must be a list of str",))]:
        prof.write_text(text)
        assert_one_line_error(build("--target", str(prof)), str(prof), *needles)
    prof.write_bytes(b"name = '\xff'\n")
    assert_one_line_error(build("--target", str(prof)), str(prof), "cannot read")
    assert_one_line_error(build("--config", str(tmp_path)), str(tmp_path), "cannot read the --config file")
    base = tmp_path / "base"
    shutil.copytree(tiny_bert, base)
    (base / "config.json").write_text("{not json")
    assert_one_line_error(build("--base-model", str(base)), "config.json:1: invalid JSON")
    (base / "config.json").write_text('{"hidden_size": 32}')
    assert_one_line_error(build("--base-model", str(base)), "config.json: num_attention_heads must be a positive")
    (base / "config.json").unlink()
    assert_one_line_error(build("--base-model", str(base)), "config.json: missing")
    assert_one_line_error(build("--base-model", "nosuch"), "--base-model nosuch: neither a folder nor one of minilm, mpnet")
    blocked = tmp_path / "cache-file"
    blocked.write_text("a file, not a folder")
    assert_one_line_error(build("--base-model", str(tiny_bert), "--cache", str(blocked)), "--cache", str(blocked),
                          "cannot write the teacher stage")
    assert not (tmp_path / "o" / "report.json").exists()


def test_over_budget_build_ships_the_best_try_with_exit_code_3(tmp_path, tiny_bert):
    import json

    profile = tmp_path / "p.toml"
    profile.write_text('extends = "android"\nname = "strict-phone"\nruntimes = ["onnx"]\nprimary_runtime = "onnx"\n'
                       'stages = ["teacher", "trim_vocab", "export", "package"]\n'
                       "[budget]\nintent_drop_pts = -5.0\n[compress]\nvocab_budget = 340\nmax_retries = 0\n")
    out = tmp_path / "o"
    res = run_process("build", "--data", str(DEMO), "--out", str(out), "--base-model", str(tiny_bert), "--target",
              str(profile), "--set", "teacher.epochs=1", "--set", "teacher.steps_limit=3", "--set",
              "package.bench_utterances=0", "--set", "decoding.compare_argmax=false")
    assert res.returncode == 3, res.stderr[-2000:]
    assert "over budget: stage trim_vocab" in res.stderr and (out / "manifest.json").is_file()
    assert json.loads((out / "report.json").read_text())["over_budget"][0]["stage"] == "trim_vocab"


def test_cache_ls_and_prune(tmp_path):
    from edgekit.engine.cache import StageCache

    c = StageCache(tmp_path / "c")
    work = c.workdir("teacher")
    (work / "model.safetensors").write_bytes(b"x" * 1000)
    c.put("teacher", "ab" * 32, work, {"record": {}})
    res = run("cache", "ls", "--cache", str(tmp_path / "c"))
    assert res.returncode == 0 and "teacher" in res.stdout and "1 entries" in res.stdout
    assert_one_line_error(run("cache", "prune", "--cache", str(tmp_path / "c")), "--older-than")
    res = run("cache", "prune", "--cache", str(tmp_path / "c"), "--older-than", "1")
    assert "removed 0 entries" in res.stdout
    (tmp_path / "c" / "features").mkdir()  # the label-issue search keeps files, not folders, as its entries
    (tmp_path / "c" / "features" / "oof-slots-0123.npy").write_bytes(b"y" * 500)
    result = (tmp_path / "c" / "teacher" / ("ab" * 32) / "result.json").stat().st_size
    assert {e["key"]: e["bytes"] for e in c.entries()} == {"ab" * 32: 1000 + result, "oof-slots-0123.npy": 500}
    res = run("cache", "prune", "--cache", str(tmp_path / "c"), "--all")
    assert "removed 2 entries" in res.stdout and c.entries() == []
    assert not any((tmp_path / "c" / "features").iterdir())
    res = run("cache", "ls", "--cache", str(tmp_path / "typo"))  # a folder no build used: said, not "0 entries"
    assert res.returncode == 0 and "no stage cache in" in res.stdout and not (tmp_path / "typo").exists()
