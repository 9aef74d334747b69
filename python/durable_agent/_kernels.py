"""Selects the kernel implementation: the pure-Python reference or the native extension.

The only place that reads ``DURABLE_AGENT_NATIVE``:

* ``auto`` (default, also when empty): use ``durable_agent_native`` when it is installed, its
  version matches this package exactly and it provides every kernel; else the pure kernels
  (a mismatched or incomplete extension also warns);
* ``1``: require the native extension; a missing, mismatched or incomplete one is an error
  (`FeatureUnavailableError`) at import;
* ``0``: never import it;
* anything else: `ConfigurationError` at import.

``NATIVE`` (re-exported as ``durable_agent.NATIVE``) is True when the native kernels are active.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Protocol

from . import _pure
from ._errors import ConfigurationError, FeatureUnavailableError
from ._version import __version__

ENV_VAR = "DURABLE_AGENT_NATIVE"
MODES = ("auto", "0", "1")


class Kernels(Protocol):
    """The kernels `_pure` and `durable_agent_native` both provide (each module satisfies this)."""

    def encode(self, value: Any, /) -> str: ...
    def decode(self, text: str, /) -> Any: ...
    def b64url_encode(self, data: bytes, /) -> str: ...
    def b64url_decode(self, text: object, /) -> bytes | None: ...
    def hmac_sha256(self, key: bytes, message: bytes, /) -> bytes: ...
    def token_open(self, token: object, key: bytes, /) -> Any: ...
    def token_sign(self, key: bytes, payload: str, /) -> str: ...
    def token_verify(self, token: object, key: bytes, /) -> str | None: ...


def _select(mode: str) -> tuple[Kernels, bool]:
    if mode not in MODES:
        raise ConfigurationError(f"{ENV_VAR} must be 'auto', '0' or '1', not {mode!r}")
    if mode == "0":
        return _pure, False
    try:
        import durable_agent_native as native
    except ImportError as exc:
        if mode == "1":
            raise FeatureUnavailableError(
                f"{ENV_VAR}=1 but the native extension is not installed "
                "(pip install 'durable-agent[native]', or scripts/build-native): " + str(exc)
            ) from exc
        return _pure, False
    found = getattr(native, "__version__", None)
    missing = [name for name in _pure.__all__ if not callable(getattr(native, name, None))]
    if found != __version__:
        problem = f"durable_agent_native {found} does not match durable-agent {__version__}"
    elif missing:
        problem = f"durable_agent_native {found} lacks the kernels {', '.join(missing)}"
    else:
        return native, True
    if mode == "1":
        raise FeatureUnavailableError(problem + f" ({ENV_VAR}=1)")
    warnings.warn(problem + "; using the pure-Python kernels", RuntimeWarning, stacklevel=2)
    return _pure, False


kernels, NATIVE = _select(os.environ.get(ENV_VAR, "auto").strip() or "auto")
