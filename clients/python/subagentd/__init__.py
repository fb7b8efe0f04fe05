"""subagentd: a client of the subagentd service (LLM sub-agents run as durable jobs).

    from subagentd import Client
    client = Client(base_url="http://127.0.0.1:8080", api_key="sk_…")
    task = client.tasks.run(prompt="List the moons of Jupiter", subagent_type="research", model="mock/m")
    print(task.status, task.summary)
"""
from . import webhooks
from ._async import AsyncClient
from ._base import SETTLED, TERMINAL, Retry, __version__, approve, deny, output
from ._errors import (
    APIConnectionError, APIStatusError, APITimeoutError, AuthenticationError, ConflictError, NotFoundError,
    PermissionDeniedError, RateLimitError, ServerError, SubagentdError, ValidationError,
)
from ._models import (
    Agent, Call, CancelledMany, Event, EventsPage, FieldError, Key, Limits, Message, NewKey, PendingAction, Problem,
    Schedule, Task, TaskPage, TenantView, Tool, ToolSource, UsageReport, UsageRow,
)
from ._sync import Client

__all__ = [
    "Client", "AsyncClient", "webhooks", "Retry", "approve", "deny", "output", "TERMINAL", "SETTLED", "__version__",
    "SubagentdError", "APIConnectionError", "APITimeoutError", "APIStatusError", "ValidationError",
    "AuthenticationError", "PermissionDeniedError", "NotFoundError", "ConflictError", "RateLimitError", "ServerError",
    "Agent", "Call", "CancelledMany", "Event", "EventsPage", "FieldError", "Key", "Limits", "Message", "NewKey",
    "PendingAction", "Problem", "Schedule", "Task", "TaskPage", "TenantView", "Tool", "ToolSource", "UsageReport",
    "UsageRow",
]
