"""`edgekit data check` as a user meets it: a summary with file:line, exit 0 with warnings, 2 under --strict and on
bad data (one line), JSON, files under --out, and no torch on its import path."""

import json
import subprocess
import sys

from tests.cli.test_cli import assert_one_line_error, bad_jointbert, run
from tests.data.test_check import dataset


def test_summary_names_each_finding_by_file_and_line(tmp_path, tiny_bert):
    data = dataset(tmp_path / "d", train=["play queen|O B-artist|Play", "play queen|O B-artist|Play"],
                   test=["play  Queen|O B-artist|Play"])
    res = run("data", "check", str(tmp_path / "d"), "--base-model", str(tiny_bert))
    assert res.returncode == 0, res.stderr
    assert f"{data.source} (jointbert): train 4, dev 1, test 2; 2 intents, 1 slot types" in res.stdout
    assert f"{tmp_path / 'd' / 'train' / 'seq.in'}:2: 'play queen' 2 times in train" in res.stdout
    assert f"{tmp_path / 'd' / 'test' / 'seq.in'}:1: 'play Queen' in test is also in train" in res.stdout
    assert "max_len 8: p99 of train and dev" in res.stdout  # tiny_bert's pieces: at most 8, as a build chooses


def test_strict_json_and_out(tmp_path, tiny_bert):
    dataset(tmp_path / "d", train=["play queen|O B-artist|Play", "play queen|O B-artist|Play"])
    args = ["data", "check", str(tmp_path / "d"), "--base-model", str(tiny_bert)]
    assert_one_line_error(run(*args, "--strict"), "--strict: 4 findings", "seq.in:2: duplicate:")
    res = run(*args, "--json", "--out", str(tmp_path / "o"))
    assert res.returncode == 0
    got = json.loads(res.stdout)
    assert got["counts"] == {"duplicate": 1, "rare_intent": 2, "few_slot_values": 1} and got["total"] == 4
    assert json.loads((tmp_path / "o" / "data_check.json").read_text()) == got
    dataset(tmp_path / "clean")
    assert run("data", "check", str(tmp_path / "clean"), "--base-model", str(tiny_bert)).returncode == 0


def test_bad_data_is_one_line_with_exit_2(tmp_path):
    bad_jointbert(tmp_path / "data")
    assert_one_line_error(run("data", "check", str(tmp_path / "data")), "seq.out:2:", "2 tags")
    assert_one_line_error(run("data", "check", str(tmp_path / "missing")), "no such file or folder")
    assert_one_line_error(run("data", "check", str(tmp_path / "data"), "--label-issues"), "give --out DIR")


def test_the_check_loads_no_torch(tmp_path, tiny_bert):
    dataset(tmp_path / "d", train=["play queen|O B-artist|Play", "play queen|O B-artist|Play"])
    code = ("import sys\nfrom edgekit.cli import main\n"
            f"sys.argv = ['edgekit', 'data', 'check', {str(tmp_path / 'd')!r}, '--base-model', {str(tiny_bert)!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch loaded' if 'torch' in sys.modules else 'no torch')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "max_len 8" in res.stdout and "duplicate" in res.stdout  # the tokenizer ran
    assert res.stdout.strip().endswith("no torch")


def test_seed_draws_the_missing_splits_as_a_build_with_that_seed_does(tmp_path, tiny_bert):
    path = tmp_path / "d.jsonl"  # no dev or test: both drawn, with --seed as a build draws them
    path.write_text("".join(json.dumps({"text": f"play song {i}", "intent": "ab"[i % 2]}) + "\n" for i in range(60)))
    for seed in (0, 3):
        res = run("data", "check", str(path), "--seed", str(seed), "--json", "--base-model", str(tiny_bert))
        notes = json.loads(res.stdout)["data"]["notes"]
        assert f"test: a deterministic stratified 10% of train (seed {seed})" in notes, notes
