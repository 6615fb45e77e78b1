"""Async client of the sandbox service (``python -m verl_agentic.sandbox.server``)::

    async with SandboxClient("http://127.0.0.1:8100") as client:
        box = await client.create("HumanEval/0", {"solution.py": "..."}, key=episode_id)
        res = await client.exec(box["sandbox_id"], "python -m doctest solution.py", timeout_s=10)
        res["exit_code"], res["stdout"], res["error_type"]           # the SandboxResult fields
        await client.write_file(box["sandbox_id"], "solution.py", new_text)
        outcome = await client.run_hidden_tests(box["sandbox_id"], tests)  # HiddenTestResult
        await client.destroy(box["sandbox_id"])

Every failure is a ``SandboxError(type, message, status)`` (a ``serving.ServiceError``): the
service's typed errors (see ``server.py``) as they are, plus ``service_unavailable`` (it could not
be reached, or answered 5xx, after the retries), ``bad_response`` (not the JSON it should be) and
``timeout``. ``error.fatal`` says whether the sandbox is unusable (the service is gone or
restarted, the sandbox was reaped or destroyed, the cap was hit) rather than the caller's request
being wrong (a path outside the sandbox, a missing file).

Transport: ``serving.HttpTransport``, a connection per request (loopback: ~0.1 ms; a restarted
service then shows as a refused connection, retried, or a 404 ``sandbox_lost``, never as a pooled
connection that died). Retries (``max_retries``, backoff from ``retry_backoff_s`` doubling, capped
at 2 s): a connection that could not be made is retried for every request, since nothing was
sent; other connection failures and 5xx answers only for requests that are safe to repeat (reads,
writes of a whole file, destroy, and create with a ``key``). ``create(wait_s=...)`` also waits for
a free slot while the service answers 429.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Optional

from verl_agentic.sandbox.runtime import FileSet, HiddenTests, HiddenTestResult, file_list
from verl_agentic.serving.errors import ServiceError

# error types that are the request's fault, not the sandbox's: the sandbox is still usable
REQUEST_ERRORS = frozenset({"bad_request", "bad_path", "path_outside_sandbox", "file_not_found", "request_too_large"})
_BACKOFF_CAP_S = 2.0


class SandboxError(ServiceError):
    def __init__(self, type: str, message: str, status: Optional[int] = None, extra: Optional[dict] = None):
        super().__init__(status, type, message, **dict(extra or {}))

    @classmethod
    def of(cls, e: ServiceError) -> "SandboxError":
        return cls(e.type, e.message, e.status, e.extra)

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"

    @property
    def fatal(self) -> bool:
        return self.type not in REQUEST_ERRORS


class SandboxClient:
    """One aiohttp session (created on first use, in the running loop); close it when done."""

    def __init__(self, url: str, *, request_timeout_s: float = 60.0, max_retries: int = 4,
                 retry_backoff_s: float = 0.2):
        # aiohttp on first use: the swedev task is imported wherever its scorer is (prime's workers)
        from verl_agentic.serving.client import HttpTransport

        self._http = HttpTransport(url, name="sandbox service", request_timeout_s=request_timeout_s,
                                   max_retries=max_retries, retry_backoff_s=retry_backoff_s,
                                   backoff_cap_s=_BACKOFF_CAP_S, fresh_connections=True,
                                   unrecorded_fields=("key",))  # a fresh idempotency key every episode
        self.url = self._http.url
        self.request_timeout_s = self._http.request_timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = float(retry_backoff_s)

    async def __aenter__(self) -> "SandboxClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    # -- the API ----------------------------------------------------------------------------------
    async def health(self) -> dict:
        return await self._request("GET", "/health", idempotent=True)

    async def create(self, instance_id: str, files: Optional[FileSet] = None, *, key: Optional[str] = None,
                     limits: Optional[dict] = None, wait_s: float = 0.0) -> dict:
        """A sandbox of ``instance_id`` (from ``files``, else the files the service has for it).

        With ``key`` the request is idempotent (retried freely; a live sandbox with that key is
        returned). While the service answers 429, retry for up to ``wait_s`` seconds.
        """
        body: dict = {"instance_id": instance_id}
        if files is not None:
            body["files"] = file_list(files)
        if key is not None:
            body["key"] = key
        if limits:
            body["limits"] = limits
        deadline = time.monotonic() + max(0.0, wait_s)
        delay = 0.25
        while True:
            try:
                return await self._request("POST", "/sandboxes", body, idempotent=key is not None)
            except SandboxError as e:
                left = deadline - time.monotonic()
                if e.type != "too_many_sandboxes" or left <= 0:
                    if e.type == "too_many_sandboxes" and wait_s > 0:
                        raise SandboxError(e.type, f"{e.message} (still full after waiting {wait_s:g} s)", e.status,
                                           e.extra) from None
                    raise
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _BACKOFF_CAP_S)

    async def info(self, sandbox_id: str) -> dict:
        return await self._request("GET", f"/sandboxes/{sandbox_id}", idempotent=True)

    async def list(self, instance_id: Optional[str] = None) -> list[dict]:
        query = {"instance_id": instance_id} if instance_id is not None else None
        return (await self._request("GET", "/sandboxes", params=query, idempotent=True))["sandboxes"]

    async def exec(self, sandbox_id: str, command: str, timeout_s: Optional[float] = None) -> dict:
        """Run a shell command; the SandboxResult fields (``stdout``, ``exit_code``, ``error_type``, ...)."""
        body: dict = {"command": command}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return await self._request("POST", f"/sandboxes/{sandbox_id}/exec", body, run_s=timeout_s)

    async def run_hidden_tests(self, sandbox_id: str, tests: HiddenTests,
                               timeout_s: Optional[float] = None) -> HiddenTestResult:
        body = tests.as_dict()
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        answer = await self._request("POST", f"/sandboxes/{sandbox_id}/test", body, run_s=timeout_s)
        return HiddenTestResult.from_dict(answer)

    async def read_file(self, sandbox_id: str, path: str) -> dict:
        """``{"type": "file", "content", "truncated", "binary", "size"}`` or ``{"type": "directory", "entries"}``."""
        return await self._request("GET", f"/sandboxes/{sandbox_id}/files", params={"path": path}, idempotent=True)

    async def write_file(self, sandbox_id: str, path: str, content: str) -> dict:
        return await self._request("PUT", f"/sandboxes/{sandbox_id}/files", {"path": path, "content": content},
                                   idempotent=True)

    async def changes(self, sandbox_id: str) -> dict:
        """``{"files": [{path, content}], "deleted": [...], "skipped": [...]}`` against the initial files."""
        return await self._request("GET", f"/sandboxes/{sandbox_id}/changes", idempotent=True)

    async def destroy(self, sandbox_id: str) -> bool:
        """True when this call destroyed it; False when it was already gone (destroyed, reaped, lost)."""
        try:
            await self._request("DELETE", f"/sandboxes/{sandbox_id}", idempotent=True)
            return True
        except SandboxError as e:
            if e.type in ("unknown_sandbox", "sandbox_reaped", "sandbox_lost"):
                return False
            raise

    # -- transport --------------------------------------------------------------------------------
    async def _request(self, method: str, path: str, body: Optional[dict] = None, *, params: Optional[dict] = None,
                       idempotent: bool = False, run_s: Optional[float] = None) -> dict:
        """One API call with retries (see the module docstring); the JSON answer or a SandboxError."""
        try:
            # a command's request waits for the command: its own timeout plus the usual allowance
            return await self._http.request(method, path, json_body=body, params=params, idempotent=idempotent,
                                            timeout_s=self.request_timeout_s + (run_s or 0.0))
        except ServiceError as e:
            raise SandboxError.of(e) from None
