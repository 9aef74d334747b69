"""Selects the kernel implementation: the pure-Python reference or the native extension.

The only place that reads ``DURABLE_AGENT_NATIVE``:

* ``auto`` (default): use ``durable_agent_native`` when it is installed and its version matches
  this package exactly, else the pure kernels;
* ``1``: require the native extension; a missing or mismatched one is an import error;
* ``0``: never import it.
"""

from __future__ import annotations

import os
import warnings
from types import ModuleType

from . import _pure
from ._version import __version__
from .errors import ConfigurationError, FeatureUnavailableError

ENV_VAR = "DURABLE_AGENT_NATIVE"


def _select(mode: str) -> tuple[ModuleType, bool]:
    if mode not in ("auto", "0", "1"):
        raise ConfigurationError(f"{ENV_VAR} must be 'auto', '0' or '1', not {mode!r}")
    if mode == "0":
        return _pure, False
    try:
        import durable_agent_native as native
    except ImportError as exc:
        if mode == "1":
            raise FeatureUnavailableError(
                f"{ENV_VAR}=1 but the native extension is not installed "
                "(pip install 'durable-agent[native]'): " + str(exc)
            ) from exc
        return _pure, False
    found = getattr(native, "__version__", None)
    if found != __version__:
        message = f"durable_agent_native {found} does not match durable-agent {__version__}"
        if mode == "1":
            raise FeatureUnavailableError(message + f" ({ENV_VAR}=1)")
        warnings.warn(message + "; using the pure-Python kernels", RuntimeWarning, stacklevel=2)
        return _pure, False
    return native, True


kernels, NATIVE = _select(os.environ.get(ENV_VAR, "auto").strip() or "auto")
