"""ckpt-sidecar: keeps training checkpoints safe on interruptible GPUs."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ckpt-sidecar")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
