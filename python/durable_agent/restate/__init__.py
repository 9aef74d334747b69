"""Agents on Restate: the journal's `replay` mode (``pip install 'durable-agent[restate]'``).

`agent_app(agent)` serves an `Agent` as a Restate Virtual Object keyed by session id;
`RestateIngress` calls it (and resolves its approvals) from any process. Importing this
package imports the Restate SDK; `import durable_agent` alone never does.
"""

from __future__ import annotations

try:
    import restate as _restate_sdk  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from ..errors import FeatureUnavailableError

    raise FeatureUnavailableError(
        f"durable_agent.restate needs the Restate SDK: pip install 'durable-agent[restate]' ({exc})"
    ) from exc

from .client import RestateIngress, RestateIngressError
from .runtime import RestateRuntime
from .scope import RestateScope
from .service import agent_app, agent_services, approvals_name, result_json, run_agent

__all__ = [
    "RestateIngress",
    "RestateIngressError",
    "RestateRuntime",
    "RestateScope",
    "agent_app",
    "agent_services",
    "approvals_name",
    "result_json",
    "run_agent",
]
