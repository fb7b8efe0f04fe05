"""Webhooks: check that a request came from the service (its signature), and read its payload.

The service signs every webhook (and every tool call) with the tenant's signing secret:
`Subagent-Timestamp: <unix seconds>` and `Subagent-Signature: v1=<hex HMAC-SHA256 of
"<timestamp>.<body>">`.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Union

from . import _models as m
from ._errors import SubagentdError


class WebhookVerificationError(SubagentdError):
    """The request is not signed by the service with this secret (or is too old)."""


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


def verify(secret: str, headers: Mapping[str, str], body: Union[bytes, str], *, tolerance: float = 300.0) -> None:
    """Raise `WebhookVerificationError` unless `body` was signed with `secret` within
    `tolerance` seconds (the headers as received; the body's bytes as received)."""
    raw = body.encode() if isinstance(body, str) else body
    ts = _header(headers, "subagent-timestamp")
    sig = _header(headers, "subagent-signature")
    if not ts or not sig:
        raise WebhookVerificationError("no Subagent-Timestamp or Subagent-Signature header")
    try:
        when = int(ts)
    except ValueError:
        raise WebhookVerificationError("Subagent-Timestamp is not a number") from None
    if tolerance and abs(time.time() - when) > tolerance:
        raise WebhookVerificationError("the signature is too old (or from the future)")
    want = "v1=" + hmac.new(secret.encode(), f"{when}.".encode() + raw, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(want, s.strip()) for s in sig.split(",")):
        raise WebhookVerificationError("the signature does not match")


@dataclass
class Event:
    """A webhook's payload: `event` (`task.finished`, `task.requires_action`), the task, and for a
    pause which one and what it waits for."""

    event: str
    task: m.Task
    pause: Optional[int] = None
    actions: List[Dict[str, Any]] = field(default_factory=list)
    extra: Dict[str, Any] = field(default_factory=dict)


def parse(body: Union[bytes, str]) -> Event:
    """Read a webhook's payload (check it with `verify` first)."""
    data = json.loads(body)
    known = {"event", "task", "pause", "actions"}
    return Event(event=data["event"], task=m.Task.from_dict(data["task"]), pause=data.get("pause"),
                 actions=list(data.get("actions") or []), extra={k: v for k, v in data.items() if k not in known})


def construct_event(secret: str, headers: Mapping[str, str], body: Union[bytes, str], **kw: Any) -> Event:
    """`verify`, then `parse`."""
    verify(secret, headers, body, **kw)
    return parse(body)
