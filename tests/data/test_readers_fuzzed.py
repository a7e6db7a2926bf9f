"""The readers' hypothesis tests (tests/data/test_data_fuzz.py, 300 examples each) in a child process: a crash of
the process is a failed test here, not the end of the test run."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO, need_module


def test_the_readers_fuzzed_in_a_child_process(tmp_path):
    need_module("hypothesis", "hypothesis (the dev extra)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"EDGEKIT_FUZZ_CHILD": "1",
                                                                                  "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                        "--basetemp", str(tmp_path / "t"), "tests/data/test_data_fuzz.py"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=1200)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= 8 and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-1000:]
