"""What `Predictor.open` costs in time and memory, each runtime in a fresh process (docs/package-format.md, "What
an open holds in memory"). Uses only `Predictor.open` and `predict`, so the same script measures an older edgekit:
run it with that checkout's interpreter for the "before" column.

    python examples/open_cost.py build/snips-android [--runtime executorch] [--opens 5]

Per runtime: the first open in a fresh process (the runtime's own start included), the median of the later opens,
the resident memory the first open added, what each later open added (predictors kept alive), and the process's
peak. One JSON line each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, os, resource, statistics, sys, time
import psutil
from edgekit.runtime import Predictor

root, runtime, opens = sys.argv[1], sys.argv[2], int(sys.argv[3])
proc = psutil.Process()
import torch  # noqa: F401  (both runtimes' imports paid before the clock starts)
if runtime == "executorch":
    from edgekit.runtime.backends import executorch_native
    executorch_native()
else:
    import onnxruntime  # noqa: F401
rss0 = proc.memory_info().rss
t0 = time.perf_counter()
kept = [Predictor.open(root, runtime)]
first = time.perf_counter() - t0
kept[0].predict("play queen")
rss1 = proc.memory_info().rss
times = []
for _ in range(opens):
    t0 = time.perf_counter()
    kept.append(Predictor.open(root, runtime))
    times.append(time.perf_counter() - t0)
rss2 = proc.memory_info().rss
print(json.dumps({"runtime": runtime, "first_open_ms": round(first * 1000, 1),
                  "later_open_ms": round(statistics.median(times) * 1000, 1),
                  "first_open_rss_mb": round((rss1 - rss0) / 1e6, 1),
                  "later_open_rss_mb": round((rss2 - rss1) / 1e6 / max(1, opens), 1),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3, 1)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("package")
    ap.add_argument("--runtime", action="append", help="executorch and/or onnx (default: the package's models)")
    ap.add_argument("--opens", type=int, default=5)
    args = ap.parse_args()
    manifest = json.load(open(f"{args.package}/manifest.json"))
    size = {rt: manifest["files"][name]["bytes"] for rt, name in manifest["models"].items()}
    for runtime in args.runtime or list(manifest["models"]):
        r = subprocess.run([sys.executable, "-c", CHILD, args.package, runtime, str(args.opens)], capture_output=True,
                           text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        if r.returncode:
            sys.exit(f"{runtime}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
        print(json.dumps({**json.loads(r.stdout.splitlines()[-1]), "model_bytes": size[runtime]}))


if __name__ == "__main__":
    main()
