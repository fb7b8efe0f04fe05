"""What the sync and the async client share: configuration, the retry policy, requests as
values, the Server-Sent Events reader, and answers to pending actions."""
from __future__ import annotations

import json
import os
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ._errors import APIStatusError, SubagentdError, error_for

__version__ = "0.1.0"
USER_AGENT = f"subagentd-python/{__version__}"
TERMINAL = {"completed", "incomplete", "failed", "cancelled"}
#: A task that `run` and `wait` stop at: it ended, or it waits for answers.
SETTLED = TERMINAL | {"requires_action"}


def config(base_url: Optional[str], api_key: Optional[str]) -> Tuple[str, Optional[str]]:
    url = base_url or os.environ.get("SUBAGENTD_URL") or "http://127.0.0.1:8080"
    key = api_key if api_key is not None else os.environ.get("SUBAGENTD_API_KEY")
    return url.rstrip("/"), key


@dataclass
class Retry:
    """Retries: 429 and 503 (after `Retry-After` when the service sends one, else backoff with
    jitter), and a dropped connection — only for a request that is safe to repeat (reads, and a
    task's creation, which always carries an `Idempotency-Key`)."""

    max_retries: int = 3
    base: float = 0.25
    cap: float = 8.0

    def delay(self, attempt: int, retry_after: Optional[str]) -> float:
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), 60.0)
            except ValueError:
                pass
        return random.uniform(0, min(self.cap, self.base * (2 ** attempt)))


@dataclass
class Req:
    method: str
    path: str
    params: Dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: Optional[bytes] = None
    headers: Dict[str, str] = field(default_factory=dict)
    #: Safe to send again after a dropped connection.
    repeatable: bool = False


def params(**kw: Any) -> Dict[str, Any]:
    """Query parameters, without the ones not given (booleans as `true`/`false`)."""
    out: Dict[str, Any] = {}
    for k, v in kw.items():
        if v is None:
            continue
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, (list, tuple)):
            v = ",".join(str(x) for x in v)
        elif isinstance(v, dict):
            v = json.dumps(v, separators=(",", ":"))
        out[k] = v
    return out


def body(**kw: Any) -> Dict[str, Any]:
    """A JSON body with the fields given (None: not sent)."""
    return {k: v for k, v in kw.items() if v is not None}


def create_req(fields: Dict[str, Any], idempotency_key: Optional[str], wait: bool, timeout: Optional[float]) -> Req:
    # A create always carries a key, so that a retry after a dropped connection makes no second task.
    key = idempotency_key or f"subagentd-py-{uuid.uuid4()}"
    return Req("POST", "/tasks", params=params(wait=wait or None, timeout=timeout if wait else None),
               json=body(**fields), headers={"Idempotency-Key": key}, repeatable=True)


def problem_of(status: int, text: str, headers: Mapping[str, str]) -> APIStatusError:
    try:
        problem = json.loads(text) if text else None
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {"detail": text[:500]} if text else None
    return error_for(status, problem, {k.lower(): v for k, v in headers.items()})


#: An answer to a pending action.
Answer = Dict[str, Any]


def approve(action_id: str, message: Optional[str] = None) -> Answer:
    """Approve a pending call: it runs."""
    return body(id=str(action_id), decision="approve", message=message)


def deny(action_id: str, message: Optional[str] = None) -> Answer:
    """Deny a pending call: the sub-agent is told (with `message`), and it does not run."""
    return body(id=str(action_id), decision="deny", message=message)


def output(action_id: str, value: Any) -> Answer:
    """Give a caller tool's output (any JSON)."""
    return {"id": str(action_id), "output": value}


class SseReader:
    """Server-Sent Events from chunks of text: each event's `id`, `event` and parsed `data`."""

    def __init__(self) -> None:
        self.buf = ""

    def feed(self, chunk: str) -> List[Dict[str, Any]]:
        self.buf += chunk.replace("\r\n", "\n")
        out = []
        while "\n\n" in self.buf:
            block, self.buf = self.buf.split("\n\n", 1)
            ev: Dict[str, Any] = {"id": None, "event": "message", "data": None}
            data: List[str] = []
            for line in block.split("\n"):
                if not line or line.startswith(":"):
                    continue
                k, _, v = line.partition(":")
                v = v[1:] if v.startswith(" ") else v
                if k == "id":
                    ev["id"] = v
                elif k == "event":
                    ev["event"] = v
                elif k == "data":
                    data.append(v)
            if not data:
                continue
            text = "\n".join(data)
            try:
                ev["data"] = json.loads(text)
            except ValueError:
                ev["data"] = text
            out.append(ev)
        return out


def not_ok(e: Exception) -> bool:
    return isinstance(e, SubagentdError)


def as_list(v: Union[str, Iterable[str], None]) -> Optional[List[str]]:
    if v is None:
        return None
    return [v] if isinstance(v, str) else list(v)
