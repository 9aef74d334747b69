"""The Restate SDK, imported on first use: every module of `durable_agent.restate` imports without it."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ..._errors import FeatureUnavailableError
from ..._kernels import kernels


def sdk() -> ModuleType:
    """The `restate` module, or `FeatureUnavailableError` naming the extra to install."""
    try:
        import restate
    except ImportError as exc:
        raise FeatureUnavailableError(
            f"durable_agent.restate needs the Restate SDK: pip install 'durable-agent[restate]' ({exc})"
        ) from exc
    return restate


def raw_serde() -> Any:
    """Restate's serde of raw bytes: what this package journals and stores is codec text (bytes-safe)."""
    from restate.serde import BytesSerde

    sdk()
    return BytesSerde()


def codec_run() -> Any:
    """Run options of an action that returns `encoded` data."""
    return sdk().RunOptions(serde=raw_serde())


def encoded(value: Any) -> bytes:
    """`value` as codec text (the checkpoint codec: JSON that keeps bytes and every JSON number)."""
    return kernels.encode(value).encode()


def decoded(raw: bytes) -> Any:
    return kernels.decode(raw.decode())
