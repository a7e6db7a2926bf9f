"""edgekit.runtime: loads a package and runs it. Depends only on the package format, never on training."""

from edgekit.runtime.package import Package, PackageError
from edgekit.runtime.predictor import Predictor

__all__ = ["Package", "PackageError", "Predictor"]
