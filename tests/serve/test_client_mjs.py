"""examples/web/client.mjs against docs/package-format.md's rules (R2-R14): its `node --test` unit tests, which run
on a fake ONNX Runtime and a fake SentencePiece (no `npm ci`, no package, no model), run here so that the suite
fails when they do. tests/serve/test_web.py runs the same client on a real package."""

import re
import shutil
import subprocess

from tests.conftest import REPO, need

CLIENT_TESTS = REPO / "examples" / "web" / "client.test.mjs"


def test_client_mjs_unit_tests_pass():
    node = shutil.which("node")
    need(node is not None, "node (examples/web/client.test.mjs)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    need(int(version.lstrip("v").split(".")[0]) >= 18, f"node 18 or later for `node --test` (found {version})")
    res = subprocess.run([node, "--test", str(CLIENT_TESTS)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]
    # The TAP summary: tests ran, and none failed or was cancelled (a file that loads no test also exits 0)
    counts = {k: int(v) for k, v in re.findall(r"^# (tests|pass|fail|cancelled) (\d+)$", res.stdout, re.M)}
    assert counts.get("fail") == 0 and counts.get("cancelled") == 0, res.stdout[-8000:]
    assert counts.get("tests", 0) >= 20 and counts.get("pass") == counts["tests"], res.stdout[-8000:]
