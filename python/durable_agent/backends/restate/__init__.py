"""The Restate backend: a run's journal kept by Restate itself (the journal's `replay` mode).

`RestateRuntime` and `RestateScope` are what a run served by `durable_agent.restate.agent_app`
runs on; they import the Restate SDK on first use only.
"""

from __future__ import annotations

from ._runtime import RestateRuntime
from ._scope import RestateScope

__all__ = ["RestateRuntime", "RestateScope"]
