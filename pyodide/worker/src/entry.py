"""Cloudflare Python Worker: durable agent runs, one Durable Object per run.

    POST /runs                      {"prompt": "..."}  → starts a run with a fresh id
    GET  /runs/{id}                 → status, last text, pending approvals (with their tokens)
    POST /runs/{id}/approvals       {"approvals": [{"approval_id", "approved", "token"}]}
    POST /runs/{id}/resume          → continue a run that stopped between steps

The Worker (`Default`) only routes: it mints run ids and forwards each request to the run's
Durable Object (`AgentRun`), whose storage holds the checkpoints (see durable_agent.backends.durable_object) and which
runs the agent (see agent_service.py). Because every request for a run lands on the same
single-threaded object, two verdicts for one run can never race.

No entropy at import time (Workers forbid it outside a request): nothing below calls uuid,
secrets or random at module level; run ids are minted in `Default.fetch`.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlparse

from agent_service import RunService, keyring_from, model_factory_from
from workers import DurableObject, Response, WorkerEntrypoint

JSON_HEADERS = {"content-type": "application/json"}


def _json(payload: object, status: int = 200) -> Response:
    return Response(json.dumps(payload), status=status, headers=JSON_HEADERS)


def _secret(env: object) -> str | None:
    secret = getattr(env, "APPROVAL_SECRET", None)
    return None if secret is None else str(secret)


class AgentRun(DurableObject):
    """One agent run: its checkpoints live in this object's SQLite-backed storage.

    The Worker calls `handle` over Durable Object RPC (strings in, a JSON string out). The base
    class keeps `self.ctx` (with `ctx.storage`) and `self.env`.
    """

    def _service(self) -> RunService:
        return RunService(self.ctx.storage, secret=_secret(self.env), model_factory=model_factory_from(self.env),
                          encryption=keyring_from(self.env))

    async def handle(self, method: str, path: str, body: str) -> str:
        try:
            status, payload = await self._service().handle(str(method), str(path), str(body or ""))
        except Exception as exc:  # noqa: BLE001 - reported, not hidden; the alarm retries an interrupted leg
            status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
        return json.dumps({"status": status, "payload": payload})

    async def alarm(self, *args: object) -> None:
        """Fires when a leg did not end in time (the object was evicted mid-run): continue the run."""
        await self._service().heal()


class Default(WorkerEntrypoint):
    """Routes each request to the Durable Object of its run."""

    async def fetch(self, request):  # untyped: request and response are objects of the Workers runtime
        path = urlparse(request.url).path.rstrip("/") or "/"
        if path == "/runs" and request.method == "POST":
            run_id = uuid.uuid4().hex  # entropy inside a request: allowed
            target = f"/runs/{run_id}"
        elif path.startswith("/runs/"):
            run_id = path.split("/")[2]
            target = path
        else:
            return _json({"error": "routes: POST /runs, GET /runs/{id}, POST /runs/{id}/approvals, "
                                   "POST /runs/{id}/resume"}, 404)
        namespace = self.env.AGENT_RUN
        stub = namespace.get(namespace.idFromName(run_id))
        body = await request.text() if request.method == "POST" else ""
        answer = json.loads(str(await stub.handle(request.method, target, body)))
        return _json(answer["payload"], answer["status"])
