"""The Restate SDK, imported on first use: every module of `durable_agent.restate` imports without it."""

from __future__ import annotations

from types import ModuleType

from ..errors import FeatureUnavailableError


def sdk() -> ModuleType:
    """The `restate` module, or `FeatureUnavailableError` naming the extra to install."""
    try:
        import restate
    except ImportError as exc:
        raise FeatureUnavailableError(
            f"durable_agent.restate needs the Restate SDK: pip install 'durable-agent[restate]' ({exc})"
        ) from exc
    return restate
