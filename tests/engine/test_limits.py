"""Issue 56, first part: size and latency budgets as the interface (`--max-size`, `--max-latency`, `[limits]`):
parsed and refused before any work, held against the package written, and in no cache key."""

import json

import pytest

from edgekit.engine import BuildConfig, build
from edgekit.engine.limits import parse_latency, parse_size
from edgekit.engine.runner import prepare
from edgekit.errors import EdgekitError
from edgekit.runtime import Package
from tests.conftest import DEMO
from tests.runtime.test_manifest_types import cli

# An ONNX-only phone package (the web profile: android's passes without an ExecuTorch lowering), one length
QUICK = {"teacher": {"epochs": 1, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2},
         "package": {"bench_utterances": 20}, "decoding": {"compare_argmax": False}}


@pytest.mark.parametrize("text,size", [("2MB", 2_000_000), ("1.5 MiB", 1_572_864), ("2000000", 2_000_000),
                                       (2_000_000, 2_000_000), ("1KB", 1000), ("1KiB", 1024), ("1e3B", 1000),
                                       ("0.5KB", 500), (None, None), ("none", None),
                                       (" None ", None)])
def test_sizes_take_decimal_and_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text,ms", [("0.4ms", 0.4), ("400us", 0.4), ("0.0004s", 0.4), (0.4, 0.4), ("2", 2.0),
                                     ("none", None)])
def test_latencies_take_us_ms_and_s(text, ms):
    assert parse_latency(text) == (ms if ms is None else pytest.approx(ms))


@pytest.mark.parametrize("flag,value", [("--max-size", "banana"), ("--max-size", "-1MB"), ("--max-size", "0"),
                                        ("--max-size", "0.5B"), ("--max-size", "2 mb"), ("--max-size", "1e400MB"),
                                        ("--max-latency", "0"), ("--max-latency", "-1ms"), ("--max-latency", "fast")])
def test_a_bad_budget_is_one_line_and_exit_2_before_any_work(tmp_path, flag, value):
    out = tmp_path / "out"
    code, said = cli(["build", "--data", str(DEMO), "--out", str(out), flag, value])
    assert code == 2 and said.startswith("error: limits.max_") and said.strip().count("\n") == 0, said
    assert value in said or repr(value) in said
    assert not out.exists()  # refused before OUT was made, so before any training


def test_a_size_no_package_of_this_data_can_reach_is_refused_before_training(tmp_path, tiny_bert):
    cfg = BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert), target="web",
                      settings={**QUICK, "limits": {"max_size": "5KB"}})
    with pytest.raises(EdgekitError, match=r"limits.max_size 5,000 bytes is less than the [\d,]+ bytes a package of "
                                           r"this data takes before any model or tokenizer \(manifest.schema.json"):
        prepare(cfg)
    assert not (tmp_path / "o").exists()


def test_a_latency_budget_needs_the_package_stage_to_measure(tmp_path):
    cfg = BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), target="web",
                      settings={"limits": {"max_latency": "1ms"}, "package": {"bench_utterances": 0}})
    with pytest.raises(EdgekitError, match="package.bench_utterances = 0 measures none"):
        prepare(cfg)


def test_a_profiles_budget_is_lifted_by_none(tmp_path):
    """TOML has no null: a profile that extends one with [limits] lifts it with "none", and so does a build
    (`--max-size none`); the flag reaches the CLI's checks as a budget it accepts."""
    from edgekit.engine import resolve

    (tmp_path / "small.toml").write_text('extends = "android"\nname = "small"\n\n[limits]\nmax_size = "2MB"\n')
    (tmp_path / "free.toml").write_text('extends = "small.toml"\nname = "free"\n\n[limits]\nmax_size = "none"\n')

    def limits(target, sets=()):
        return resolve(BuildConfig(data="x", out="y", target=str(tmp_path / target), sets=list(sets)))[1].limits

    assert limits("small.toml").max_size == 2_000_000 and limits("free.toml").max_size is None
    assert limits("small.toml", ['limits.max_size="none"']).max_size is None
    assert limits("free.toml", ['limits.max_latency="none"']).max_latency is None
    code, said = cli(["build", "--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o"), "--max-size",
                      "none"])
    assert code == 2 and "limits" not in said and "missing.csv" in said  # accepted: the missing data stops it


def test_budgets_are_held_against_the_package_and_change_no_cache_key(tmp_path, tiny_bert):
    def run(out, **limits):
        return build(BuildConfig(data=str(DEMO), out=str(tmp_path / out), base_model=str(tiny_bert), target="web",
                                 stages=["teacher", "export", "package"], settings={**QUICK, "limits": limits}))

    free = run("free")
    size, p50 = free["package"]["size_bytes"], free["latency"]["onnx"]["p50_ms"]
    assert free["limits"] is None and not free["over_budget"]
    met = run("met", max_size=size, max_latency=f"{p50 * 1000 * 100:.0f}us")
    assert all(s["reused"] for s in met["stages"])  # the budgets are in no stage's key
    assert met["limits"]["size"] == {"max_bytes": size, "bytes": size, "met": True, "counts": "onnx's files"}
    assert met["limits"]["latency"]["met"] and not met["over_budget"]
    missed = run("missed", max_size=size - 1, max_latency="1us")
    assert missed["limits"]["size"]["met"] is False and missed["limits"]["latency"]["met"] is False
    msgs = [o["message"] for o in missed["over_budget"]]
    assert msgs[0] == f"limits.max_size: the package is {size:,} bytes, 1 over the {size - 1:,}-byte budget (onnx's " \
                      "files)"
    assert msgs[1].startswith("limits.max_latency: the package's p50 on this machine is ")
    Package.load(tmp_path / "missed")  # written whole, as built
    assert "**Over budget.** limits.max_size" in (tmp_path / "missed" / "report.md").read_text()
    assert json.loads((tmp_path / "missed" / "report.json").read_text())["limits"] == missed["limits"]


def test_a_missed_size_budget_exits_3_with_one_line_and_the_package_written(tmp_path, tiny_bert):
    out = tmp_path / "o"
    sets = [f"--set=teacher.{k}={v}" for k, v in QUICK["teacher"].items()] + \
        ["--set=package.bench_utterances=20", "--set=decoding.compare_argmax=false"]
    code, said = cli(["build", "--data", str(DEMO), "--out", str(out), "--base-model", str(tiny_bert), "--target",
                      "web", "--stages", "teacher,export,package", "--max-size", "10KB", *sets])
    assert code == 3, said
    lines = [x for x in said.splitlines() if x.startswith("over budget:")]
    assert len(lines) == 1 and "limits.max_size: the package is" in lines[0] and "over the 10,000-byte" in lines[0]
    assert Package.load(out).manifest["models"] == {"onnx": "model.onnx"}


def test_report_md_renders_an_accuracy_miss_beside_a_limits_miss():
    """An accuracy gate's entry holds its budget as a table; a [limits] entry as the setting's name."""
    from edgekit.reporting.markdown import _header

    rep = {"dataset": {"name": "d", "source": "s", "format": "jsonl", "sizes": {"train": 1}, "intents": 2,
                       "slot_tags": 0, "lengths": {"max_len": 8, "p99": 5, "truncated_share": 0.0}},
           "target": "android", "task": "intent", "stages": [], "config": {"strict": False},
           "limits": {"size": {"max_bytes": 10, "bytes": 20, "met": False, "counts": "executorch's files"}},
           "over_budget": [{"stage": "distill", "budget": {"intent_drop_pts": 0.5}, "message": "distill missed"},
                           {"stage": "package", "budget": "limits.max_size", "message": "limits.max_size: over"}]}
    text = "\n".join(_header(rep))
    assert "**Over budget.** distill missed. The package is that best try." in text
    assert "**Over budget.** limits.max_size: over. The package is written as built" in text
    assert "Budgets ([limits]): size 20 bytes against 10 (missed; executorch's files)." in text


@pytest.mark.parametrize("size", [None, 2_000_000])
def test_a_gate_miss_under_a_size_budget_names_the_budget_that_kept_the_student_from_growing(size):
    """Under a size budget the search pins the student's shape (no back-off), so a dev-gate miss says why there
    was one try and how to let the build grow; without one the message is the plain miss."""
    from types import SimpleNamespace

    from edgekit.engine.gating import pinned_by_size, settle, with_size_hint

    ctx = SimpleNamespace(settings=SimpleNamespace(budget=SimpleNamespace(intent_drop_pts=0.5, slot_f1_drop_pts=1.0)),
                          search=None if size is None else {"limits": {"max_size": size, "max_latency": None}})
    tries = [{"setting": "param_share 0.09", "drops": {"intent_drop_pts": 0.516}, "passed": False,
              "budget": {"intent_drop_pts": 0.5}}]
    msg = settle(ctx, "distill", tries)["message"]  # the stage's record, cached: the same under any size budget
    assert msg.startswith("stage distill: dev accuracy budget (intent_drop_pts <= 0.5, slot_f1_drop_pts <= 1.0)")
    assert "size budget" not in msg
    hint = pinned_by_size(ctx)  # what report.json and --strict add (tests/engine/test_rank.py: a build's)
    assert ("2,000,000-byte size budget" in hint and "--max-size none" in hint) == (size is not None), hint
    assert with_size_hint(ctx, msg) == msg + hint == with_size_hint(ctx, msg + hint)  # once, cached or not
