"""Errors: one class per HTTP status family, each carrying the problem the API sent (RFC 9457
`application/problem+json`): `status`, its `code`, `detail` and the per-field `errors`."""
from __future__ import annotations

from typing import Any, Dict, List, Optional


class SubagentdError(Exception):
    """Every error of this library."""


class APIConnectionError(SubagentdError):
    """The service could not be reached, or the connection dropped before an answer."""


class APITimeoutError(APIConnectionError):
    """No answer in time."""


class APIStatusError(SubagentdError):
    """The service answered with an error status."""

    def __init__(self, status: int, problem: Optional[Dict[str, Any]], headers: Optional[Dict[str, str]] = None):
        self.status = status
        self.problem: Dict[str, Any] = problem or {}
        self.headers: Dict[str, str] = headers or {}
        self.code: Optional[str] = self.problem.get("code")
        self.title: Optional[str] = self.problem.get("title")
        self.detail: Optional[str] = self.problem.get("detail")
        self.errors: List[Dict[str, Any]] = list(self.problem.get("errors") or [])
        super().__init__(f"HTTP {status} {self.code or ''}: {self.detail or self.title or ''}".strip())


class ValidationError(APIStatusError):
    """400 or 422: the request is not valid (`errors` names each field at fault)."""


class AuthenticationError(APIStatusError):
    """401: no key, or one that is not valid."""


class PermissionDeniedError(APIStatusError):
    """403: not allowed (an admin route, a console write without its CSRF token, a host)."""


class NotFoundError(APIStatusError):
    """404: no such task (another tenant's is not found either), agent, tool or route."""


class ConflictError(APIStatusError):
    """409: the request conflicts with the state (an idempotency key used with another body, an
    action answered already, a task that is not paused)."""


class RateLimitError(APIStatusError):
    """429: a rate, queue, stream or schedule limit. `retry_after` is the wait the service asked."""

    @property
    def retry_after(self) -> Optional[float]:
        v = self.headers.get("retry-after")
        try:
            return float(v) if v is not None else None
        except ValueError:
            return None


class ServerError(APIStatusError):
    """5xx: the service could not do it now (unavailable, at capacity) or failed."""


def error_for(status: int, problem: Optional[Dict[str, Any]], headers: Optional[Dict[str, str]] = None) -> APIStatusError:
    cls = {400: ValidationError, 422: ValidationError, 401: AuthenticationError, 403: PermissionDeniedError,
           404: NotFoundError, 409: ConflictError, 429: RateLimitError}.get(status)
    if cls is None:
        cls = ServerError if status >= 500 else APIStatusError
    return cls(status, problem, headers)
