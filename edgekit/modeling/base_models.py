"""`--base-model`: the names of base_models.toml and where each one's folder is, without torch (edgekit data
check reads a base model's vocabulary with no torch loaded; edgekit.modeling.pretrained loads the weights)."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from edgekit.errors import EdgekitError

BASE_MODELS = tomllib.loads((Path(__file__).parent / "base_models.toml").read_text(encoding="utf-8"))
DEFAULT = BASE_MODELS.pop("default")


def base_folder(name: str | None, models: Path | None = None) -> Path:
    """`--base-model`: a short name from base_models.toml (default: minilm) or a local folder. `models` is where a
    model shipped in parts is assembled (the build passes the stage cache's models/ folder)."""
    from edgekit.modeling.parts import assembled

    name = name or DEFAULT
    spec = BASE_MODELS.get(name)
    if spec is None:
        if not Path(name).is_dir():
            raise EdgekitError(f"--base-model {name}: neither a folder nor one of {', '.join(BASE_MODELS)}")
        return Path(name)
    if "parts" in spec:
        if models is None:
            raise ValueError(f"{name} is assembled from parts: give the folder to assemble it in")
        return assembled(spec, name, models)
    try:
        module = importlib.import_module(spec["module"])
    except ImportError:
        raise EdgekitError(f"--base-model {name} ({spec['title']}) needs its package: {spec['install']}") from None
    return Path(module.get_model_path())
