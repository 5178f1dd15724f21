"""psych-sidecar: tool disclosure and prompt budget for LLM agent hosts, over gRPC."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("psych-sidecar")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
