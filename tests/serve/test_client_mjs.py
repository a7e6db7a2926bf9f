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


SCHEMA2 = REPO / "tests" / "fixtures" / "schema2"
R2_LINE = ("manifest.json: schema_version 2 is not supported by this client (it reads 4); rebuild the package with an "
           "edgekit that writes schema_version 4")


def test_node_cli_refuses_a_schema_2_package_with_the_specs_line():
    """docs/package-format.md R2: `node cli.mjs` (client.mjs) refuses the schema-2 fixture in one line, exit 2; the
    Python runtime still reads it (tests/runtime/test_schema2.py)."""
    web = REPO / "examples" / "web"
    need(shutil.which("node") is not None and (web / "node_modules" / "onnxruntime-node").is_dir(),
         "node and examples/web's modules (`npm ci` in examples/web)")
    res = subprocess.run(["node", "cli.mjs", str(SCHEMA2), "play queen"], cwd=web, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stderr.strip() == f"error: {R2_LINE}", (res.returncode, res.stderr)


def test_edgekit_web_refuses_a_schema_2_package_with_the_specs_line():
    """The page runs client.mjs, which reads schema 4 only: `edgekit web` refuses before it serves."""
    import sys

    need((REPO / "examples" / "web" / "dist" / "app.js").is_file(), "the page bundle (`npm run build` in examples/web)")
    res = subprocess.run([sys.executable, "-m", "edgekit.cli", "web", str(SCHEMA2), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip() == f"error: {R2_LINE}", res.stderr
