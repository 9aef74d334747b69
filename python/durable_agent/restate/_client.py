"""`RestateIngress`: call a served agent through Restate's ingress from any process (standard library only).

`resolve_awakeable(approval_id, verdict)` is what `durable_agent.resolve_approval` calls, so
``await resolve_approval(RestateIngress(url), approval_id, approved=True, token=...)`` sends a
verdict to a run parked on Restate — also while no process runs it: Restate keeps the verdict and
delivers it once a service process runs again.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from .._errors import DurableAgentError
from ._service import approvals_name


class RestateIngressError(DurableAgentError, ConnectionError):
    """The Restate ingress answered an error (or could not be reached)."""

    code = "restate_ingress"

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Unanswered(RestateIngressError):
    """The ingress accepted the request and no answer came within the time given."""


class RestateIngress:
    """The ingress URL of a Restate server and the `name` an agent is served under (`agent_app`).

    `timeout` bounds each call's wait for its answer; `answer_timeout` bounds how long
    `resolve_awakeable` waits, after Restate accepted a verdict, for the service to tell an
    unknown approval id (see there).
    """

    def __init__(self, url: str, *, name: str = "agent", timeout: float = 300.0, answer_timeout: float = 2.0) -> None:
        self.url = url.rstrip("/")
        self.name = name
        self.timeout = timeout
        self.answer_timeout = answer_timeout

    async def run(self, session_id: str, prompt: str, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """Run `prompt` as the session's next run and wait for its outcome (queued behind the session's run)."""
        result: dict[str, Any] = await self._post(self._path(self.name, session_id, "run"), prompt,
                                                  idempotency_key=idempotency_key)
        return result

    async def send(self, session_id: str, prompt: str, *, idempotency_key: str | None = None) -> str:
        """Queue `prompt` as a run without waiting; returns Restate's invocation id (see `output`)."""
        answer = await self._post(self._path(self.name, session_id, "run") + "/send", prompt,
                                  idempotency_key=idempotency_key)
        return str(answer["invocationId"])

    async def output(self, invocation_id: str) -> dict[str, Any]:
        """Wait for a sent run's outcome."""
        result: dict[str, Any] = await self._request(self._attach(invocation_id), None)
        return result

    async def status(self, session_id: str) -> dict[str, Any]:
        """The session's last run, its status and the approvals it waits on (answers while a run is parked)."""
        result: dict[str, Any] = await self._request(self._path(self.name, session_id, "status"), None, post=True)
        return result

    async def resolve_awakeable(self, approval_id: str, value: Any) -> bool:
        """Send a verdict for `approval_id`: it returns once Restate accepted it (Restate keeps it, also while
        no service process runs, and delivers it when one does).

        False when the service answers, within `answer_timeout`, that no run parked on `approval_id`
        (unknown id); True when it answers that the verdict went to the run, or does not answer in
        time (no service process runs: the verdict waits in Restate, and an unknown id is dropped then).
        """
        sent = await self._post(self._path(approvals_name(self.name), approval_id, "resolve") + "/send", value)
        try:
            return bool(await self._request(self._attach(str(sent["invocationId"])), None,
                                            timeout=self.answer_timeout))
        except _Unanswered:
            return True

    def _path(self, service: str, key: str, handler: str) -> str:
        return f"{self.url}/{service}/{urllib.parse.quote(key, safe='')}/{handler}"

    def _attach(self, invocation_id: str) -> str:
        return f"{self.url}/restate/invocation/{urllib.parse.quote(invocation_id, safe='')}/attach"

    async def _post(self, url: str, body: Any, *, idempotency_key: str | None = None) -> Any:
        return await self._request(url, json.dumps(body).encode(), post=True, idempotency_key=idempotency_key)

    async def _request(self, url: str, data: bytes | None, *, post: bool = False,
                       idempotency_key: str | None = None, timeout: float | None = None) -> Any:
        headers = {"content-type": "application/json"} if data is not None else {}
        if idempotency_key is not None:
            headers["idempotency-key"] = idempotency_key
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if post else "GET")

        def call() -> Any:
            wait = self.timeout if timeout is None else timeout
            try:
                with urllib.request.urlopen(request, timeout=wait) as answer:
                    body = answer.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:500]
                raise RestateIngressError(f"{url}: HTTP {exc.code}: {detail}", exc.code) from exc
            except (TimeoutError, urllib.error.URLError) as exc:
                if isinstance(exc, TimeoutError) or isinstance(exc.reason, TimeoutError):
                    raise _Unanswered(f"{url}: no answer within {wait} s") from exc
                raise RestateIngressError(f"{url}: {exc}") from exc
            except OSError as exc:
                raise RestateIngressError(f"{url}: {exc}") from exc
            return json.loads(body) if body else None

        return await asyncio.to_thread(call)
