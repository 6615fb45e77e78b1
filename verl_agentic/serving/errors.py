"""One error shape for every HTTP service here, on both ends of the wire.

A service answers a failure with a status and ``{"error": {"type", "message", "retryable", ...}}``:
``type`` is a short machine-readable name (``bad_request``, ``unknown_session``, ``too_many_sandboxes``,
...), ``message`` says what happened and what to do, ``retryable`` whether sending the same request
again may succeed (the service decides: a task that raised will raise again, a service shutting down
will not be there). Further fields carry detail (``scorers``, ``live``, ``max_sandboxes``, ...).

A client turns such an answer back into the same ``ServiceError`` (``error_from_answer``), so the
type a service raised is the type its caller catches. A client's own failures use three more types:
``service_unavailable`` (unreachable, or a 5xx without this shape: a proxy, a crash), ``timeout``
(no answer in time) and ``bad_response`` (an answer that is not the JSON it should be).
"""

from __future__ import annotations

import json
from typing import Any, Optional


class ServiceError(Exception):
    """A failed request: HTTP ``status`` (None: there was no answer), ``type``, ``message``,
    ``retryable`` and extra fields."""

    def __init__(self, status: Optional[int], type: str, message: str, *, retryable: bool = False, **extra: Any):
        super().__init__(message)
        self.status, self.type, self.message, self.retryable, self.extra = status, type, message, retryable, extra

    def as_json(self) -> dict:
        return {"error": {"type": self.type, "message": self.message, "retryable": self.retryable, **self.extra}}

    def response(self) -> Any:
        """The ``aiohttp.web.Response`` a server answers with."""
        from aiohttp import web  # here, not at the top: a client-only process need not import aiohttp

        return web.json_response(self.as_json(), status=self.status or 500)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.type!r}, {self.message!r})"


def error_from_answer(status: int, raw: bytes) -> Optional[ServiceError]:
    """The ``ServiceError`` a service's answer carries, or None when the body is not in the shape."""
    try:
        answer = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    err = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("type"), str):
        return None
    extra = {k: v for k, v in err.items() if k not in ("type", "message", "retryable")}
    return ServiceError(status, err["type"], str(err.get("message", "")), retryable=err.get("retryable") is True,
                        **extra)


def body_excerpt(raw: bytes, limit: int = 300) -> str:
    """The start of an answer's body, for a message."""
    return raw[:limit].decode("utf-8", "replace") or "(empty body)"


__all__ = ["ServiceError", "body_excerpt", "error_from_answer"]
