"""Agents on Restate: the journal's `replay` mode (``pip install 'durable-agent[restate]'``).

`agent_app(agent)` serves an `Agent` as a Restate Virtual Object keyed by session id;
`RestateIngress` calls it (and resolves its approvals) from any process. The Restate SDK is
imported on first use (`FeatureUnavailableError` without it), so every module here imports
without it, and `import durable_agent` never touches it.
"""

from __future__ import annotations

from ..backends.restate import RestateRuntime, RestateScope
from ._client import RestateIngress, RestateIngressError
from ._service import agent_app, agent_services, approvals_name, result_json, run_agent, serve

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
    "serve",
]
