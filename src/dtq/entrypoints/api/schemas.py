"""Request and response bodies of the HTTP API (spec §7), as msgspec Structs.

The constraints declared here (``Meta`` patterns, lengths, ranges) are enforced when a request
body is decoded into its Struct, once, by the routes' request hook, and are also what the OpenAPI
document at ``/schema`` shows. Request Structs forbid unknown fields: a misspelt ``depends_on``
must be a 400, not a silently unordered job.

Identifier rules (kept strict on purpose; documented in the OpenAPI schema):

* ``kind`` and task ``name``: 1..200 characters of ``A-Z a-z 0-9 . _ : -`` (no spaces), so they
  are safe in logs, metric labels, URLs and Redis keys.
* ``priority``: 1..32 characters of ``a-z 0-9 _ -`` (it names a Redis list, spec §5).

  Both rules live in :mod:`dtq.domain.names`, which the worker runtime applies too.
* job ``name``: up to 200 characters, no control characters (Unicode category Cc: C0, DEL and
  C1; ``\\u0000`` cannot be stored, ``\\u009b`` is a terminal's CSI), line separators or
  bidirectional overrides (``JOB_NAME_FORBIDDEN``), not
  blank: empty (the default) is a job without a name, whitespace alone is refused, and so are
  invisible format characters (Unicode category Cf: ``\\u200b``, ``\\u2060``, ``\\ufeff``...),
  alone or among whitespace.

Request bodies are decoded in msgspec's strict mode (:mod:`dtq.entrypoints.api.guards`): a value
must have the JSON type the field declares, so ``"max_attempts": "3"``, ``3.0``, ``"three"``,
``true`` and ``3.5`` are all 400s naming ``max_attempts``. An object with a key twice is a 400 as
well. Payloads and metadata are ``Any`` and kept exactly as sent.

Each pattern ends in ``(?!\\n)$`` because Python's ``$`` also matches before a trailing newline;
the lookahead makes ``"echo\\n"`` fail in Python exactly as it does in ECMA regex.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

import msgspec

from dtq.domain.entities import DEFAULT_PRIORITY
from dtq.domain.names import NAME_HINT, NAME_MAX, NAME_PATTERN, PRIORITY_HINT, PRIORITY_PATTERN
from dtq.domain.status import JobStatus, RunStatus, TaskStatus
from dtq.domain.urls import CONTROL_CHARACTERS

#: The format characters (Unicode category Cf, Unicode 14.0 of Python 3.11), as the inside of a
#: character class: invisible, so a job name of them alone is as blank as one of spaces. Those
#: of the BMP are ``\\uXXXX`` escapes, which Python and ECMA regex read alike; the others are
#: the characters themselves (ECMA's ``u`` mode reads them; no escape is common to both).
FORMAT_CHARACTERS = (
    r"\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f"
)
#: What a job name may not hold anywhere: the control characters (category Cc), the line and
#: paragraph separators (U+2028, U+2029) and the bidirectional embeddings, overrides and
#: isolates (U+202A-U+202E, U+2066-U+2069), which reorder or break the line a terminal or a page
#: shows the name on.
JOB_NAME_FORBIDDEN = rf"{CONTROL_CHARACTERS}\u2028\u2029\u202a-\u202e\u2066-\u2069"
JOB_NAME_PATTERN = rf"^(?![\s{FORMAT_CHARACTERS}]+$)[^{JOB_NAME_FORBIDDEN}]*(?!\n)$"
#: Worker ids of the HTTP worker protocol (``worker_protocol.WORKER_ID_PATTERN``).
WORKER_ID_PATTERN = r"^[\x21-\x7e]{1,200}(?!\n)$"
#: Printable ASCII only: what an HTTP header can carry without encoding games.
IDEMPOTENCY_KEY_PATTERN = r"^[\x20-\x7e]+(?!\n)$"
#: Free text PostgreSQL can store: anything but NUL (a worker's error, a release reason).
NO_NUL_PATTERN = r"^[^\x00]*$"
#: One line of text: no control character (C0, DEL, C1), a final newline included (a worker's
#: hostname).
NO_CONTROL_PATTERN = rf"^[^{CONTROL_CHARACTERS}]*(?!\n)$"
IDEMPOTENCY_KEY_MAX = 255
#: What each pattern means, in the words a 400 uses instead of the regex.
PATTERN_HINTS: dict[str, str] = {
    NAME_PATTERN: NAME_HINT,
    PRIORITY_PATTERN: PRIORITY_HINT,
    JOB_NAME_PATTERN: (
        "no control characters, line separators or bidirectional overrides, and not blank:"
        " not only whitespace or invisible characters (leave it empty for no name)"
    ),
    WORKER_ID_PATTERN: "1 to 200 printable ASCII characters, no spaces",
    IDEMPOTENCY_KEY_PATTERN: "printable ASCII characters only (0x20-0x7E)",
    NO_NUL_PATTERN: "no NUL character (\\u0000)",
    NO_CONTROL_PATTERN: "no control characters (U+0000-U+001F, U+007F-U+009F)",
}

Kind = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=NAME_MAX,
        pattern=NAME_PATTERN,
        description="Handler key (spec §6), 1..200 of A-Z a-z 0-9 . _ : -",
        examples=["echo", "email.send.v2"],
    ),
]
TaskName = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=NAME_MAX,
        pattern=NAME_PATTERN,
        description="Task name, unique within its job; 1..200 of A-Z a-z 0-9 . _ : -",
        examples=["a", "resize:thumb"],
    ),
]
Priority = Annotated[
    str,
    msgspec.Meta(
        pattern=PRIORITY_PATTERN,
        description="Ready-queue tier (spec §5 queue:ready:{priority}); a-z 0-9 _ -, 1..32",
        examples=[DEFAULT_PRIORITY, "high"],
    ),
]
MaxAttempts = Annotated[
    int, msgspec.Meta(ge=1, le=100, description="Retry budget: handler runs allowed, 1..100")
]
JobName = Annotated[
    str,
    msgspec.Meta(
        max_length=200,
        pattern=JOB_NAME_PATTERN,
        description=(
            "Free-form job name, up to 200 characters, no control characters, not blank;"
            " empty (the default): a job without a name"
        ),
    ),
]
Payload = Annotated[
    Any,
    msgspec.Meta(
        description=(
            "Any JSON value handed to the handler. Strings and keys must not contain \\u0000; "
            "integers must fit in signed 64 bits; nesting at most 64 levels; size limited by "
            "API_MAX_PAYLOAD_BYTES."
        )
    ),
]


RunAt = Annotated[
    str,
    msgspec.Meta(
        max_length=64,
        description=(
            "Run no earlier than this RFC 3339 time with an offset (a naive time is a 400),"
            " from 2000-01-01T00:00:00Z to one year ahead; a past time runs now. Not with"
            " delay."
        ),
        examples=["2026-12-01T12:00:00Z"],
    ),
]
Delay = Annotated[
    str,
    msgspec.Meta(
        max_length=64,
        description="Run after this Go duration (0s..8784h) from the submit. Not with run_at.",
        examples=["30s", "1h30m"],
    ),
]


Duration = Annotated[
    str,
    msgspec.Meta(max_length=64, description="A Go duration, e.g. 500ms, 5s, 10m, 1h30m"),
]


class RetryRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A task's retry backoff (issue 14 item 3); omitted: fixed ``RETRY_BACKOFF``.

    ``exponential`` waits ``delay * 2**(attempt-1)`` capped at ``max_delay``; ``jitter`` draws
    the wait uniformly from ``[d/2, d]``. ``delay`` defaults to ``RETRY_BACKOFF``.
    """

    backoff: Literal["fixed", "exponential"] = "fixed"
    delay: Duration | msgspec.UnsetType = msgspec.UNSET
    max_delay: Duration | msgspec.UnsetType = msgspec.UNSET
    jitter: bool = False


# --- requests ---------------------------------------------------------------------------------


class SubmitTaskRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/tasks``: a job with one task whose name is its kind."""

    kind: Kind
    payload: Payload = None
    max_attempts: MaxAttempts = 3
    priority: Priority = DEFAULT_PRIORITY
    run_at: RunAt | msgspec.UnsetType = msgspec.UNSET
    delay: Delay | msgspec.UnsetType = msgspec.UNSET
    retry: RetryRequest | msgspec.UnsetType = msgspec.UNSET
    timeout: Duration | msgspec.UnsetType = msgspec.UNSET


class TaskSpecRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One task of ``POST /v1/jobs``."""

    name: TaskName
    kind: Kind
    payload: Payload = None
    depends_on: list[TaskName] = msgspec.field(default_factory=list)
    max_attempts: MaxAttempts = 3
    priority: Priority = DEFAULT_PRIORITY
    run_at: RunAt | msgspec.UnsetType = msgspec.UNSET
    delay: Delay | msgspec.UnsetType = msgspec.UNSET
    retry: RetryRequest | msgspec.UnsetType = msgspec.UNSET
    timeout: Duration | msgspec.UnsetType = msgspec.UNSET


class SubmitJobRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/jobs``: a DAG of tasks (spec §7). At most API_MAX_TASKS_PER_JOB tasks."""

    tasks: Annotated[list[TaskSpecRequest], msgspec.Meta(min_length=1)]
    name: JobName = ""
    metadata: dict[str, Any] | None = None


# --- responses --------------------------------------------------------------------------------


class SubmitWarningBody(msgspec.Struct, kw_only=True):
    """A submit that succeeded but will not run yet (issue 14 item 7): no live worker serves
    the task's priority or kind. One per distinct priority or (priority, kind) of the request,
    naming its first task."""

    code: Literal["no_worker_for_kind", "no_worker_for_priority"]
    task: str
    message: str


#: The ``warnings`` member of the submit responses: absent when there is none.
SubmitWarnings = Annotated[
    list[SubmitWarningBody] | msgspec.UnsetType,
    msgspec.Meta(
        description=(
            "Present only when some task's priority or kind is served by no live worker (the"
            " worker registry, read at most once a second); the submit succeeded regardless"
        )
    ),
]


class SubmitTaskResponse(msgspec.Struct, kw_only=True):
    """Ids created (or replayed) by ``POST /v1/tasks``."""

    task_id: UUID
    job_id: UUID
    warnings: SubmitWarnings = msgspec.UNSET


class SubmitJobResponse(msgspec.Struct, kw_only=True):
    """Ids created (or replayed) by ``POST /v1/jobs``: task name -> task id."""

    job_id: UUID
    tasks: dict[str, UUID]
    warnings: SubmitWarnings = msgspec.UNSET


class ExplainBody(msgspec.Struct, kw_only=True):
    """``GET /v1/tasks/{id}/explain``: why the task is (not) running (issue 14 item 7)."""

    task_id: UUID
    status: TaskStatus
    reason: Annotated[
        Literal[
            "terminal",
            "waiting_on_dependencies",
            "running",
            "lease_lost",
            "scheduled",
            "queued_no_worker",
            "queued",
            "delivery_in_flight",
        ],
        msgspec.Meta(description="Stable reason code (README: Why isn't my task running?)"),
    ]
    message: Annotated[str, msgspec.Meta(description="For people; the wording may change")]
    details: Annotated[
        dict[str, Any],
        msgspec.Meta(description="The facts behind the code; keys per code in the README"),
    ]


class RunBody(msgspec.Struct, kw_only=True):
    """One delivery of a task (a ``task_runs`` row). ``attempt_number`` is not unique: a
    ``dead`` run and its successor share it (spec §4)."""

    id: UUID
    attempt_number: int
    worker_id: str
    status: RunStatus
    error: str | None
    started_at: datetime
    finished_at: datetime | None


class TaskBody(msgspec.Struct, kw_only=True):
    """A task row (spec §7 GET /v1/tasks/{id}); times are RFC 3339 UTC."""

    id: UUID
    job_id: UUID
    name: str
    kind: str
    status: TaskStatus
    priority: str
    payload: Any
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    result: Annotated[
        Any,
        msgspec.Meta(
            description="What the task's handler returned (any JSON value); null until completed"
        ),
    ] = None
    progress: Annotated[
        Any,
        msgspec.Meta(
            description=(
                "The latest progress the task's handler reported (any JSON value, stored with"
                " the lease renewal); null until reported. The next attempt resumes from it."
            )
        ),
    ] = None
    retry: Annotated[
        RetryBody | None,
        msgspec.Meta(description="The task's retry policy; null: fixed RETRY_BACKOFF"),
    ] = None
    timeout: Annotated[
        str | None,
        msgspec.Meta(description="The task's handler timeout (Go duration); null: the kind's"),
    ] = None


class RetryBody(msgspec.Struct, kw_only=True):
    """A task's stored retry policy; durations as Go durations, null when not given."""

    backoff: Literal["fixed", "exponential"]
    delay: str | None
    max_delay: str | None
    jitter: bool


class TaskDetailBody(TaskBody, kw_only=True):
    """A task with its run history ordered by ``started_at``."""

    runs: list[RunBody]


class JobBody(msgspec.Struct, kw_only=True):
    """A job with its tasks (spec §7 GET /v1/jobs/{id}) and its task counts (issue 14 item 5)."""

    id: UUID
    name: str
    status: JobStatus
    metadata: Any
    created_at: datetime
    updated_at: datetime
    tasks: list[TaskBody]
    counts: Annotated[
        dict[str, int],
        msgspec.Meta(description="Tasks of the job per status; every status present, 0 if none"),
    ] = msgspec.field(default_factory=dict)
    next_cursor: Annotated[
        str | None,
        msgspec.Meta(
            description=(
                "With ?limit=: pass as ?cursor= for the next page of tasks (submission order);"
                " null on the last page, and always null without ?limit= (every task is listed)"
            )
        ),
    ] = None


class TaskSummaryBody(msgspec.Struct, kw_only=True):
    """A task in ``GET /v1/tasks``: the fields of ``GET /v1/tasks/{id}`` without ``payload``,
    ``result``, ``progress`` and ``runs`` (read them by id)."""

    id: UUID
    job_id: UUID
    name: str
    kind: str
    status: TaskStatus
    priority: str
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    retry: RetryBody | None = None
    timeout: str | None = None


class TaskListBody(msgspec.Struct, kw_only=True):
    """``GET /v1/tasks``: one page of matching tasks, newest first."""

    tasks: list[TaskSummaryBody]
    next_cursor: Annotated[
        str | None,
        msgspec.Meta(description="Pass as ?cursor= (same filters) for the next page; null last"),
    ]


class JobSummaryBody(msgspec.Struct, kw_only=True):
    """A job in ``GET /v1/jobs``: the fields of ``GET /v1/jobs/{id}`` without its tasks."""

    id: UUID
    name: str
    status: JobStatus
    metadata: Any
    created_at: datetime
    updated_at: datetime


class JobListBody(msgspec.Struct, kw_only=True):
    """``GET /v1/jobs``: one page of matching jobs, newest first."""

    jobs: list[JobSummaryBody]
    next_cursor: Annotated[
        str | None,
        msgspec.Meta(description="Pass as ?cursor= (same filters) for the next page; null last"),
    ]


class TaskResultBody(msgspec.Struct, kw_only=True):
    """One task's result in ``GET /v1/jobs/{id}/results``."""

    name: str
    task_id: UUID
    status: TaskStatus
    result: Annotated[
        Any, msgspec.Meta(description="The handler's return value; null until completed")
    ]


class JobResultsBody(msgspec.Struct, kw_only=True):
    """``GET /v1/jobs/{id}/results``: a page of the job's results in submission order."""

    job_id: UUID
    status: JobStatus
    results: list[TaskResultBody]
    next_cursor: Annotated[
        str | None,
        msgspec.Meta(description="Pass as ?cursor= for the next page; null on the last page"),
    ]


class WorkerBody(msgspec.Struct, kw_only=True):
    """A worker of the registry (``workers`` row)."""

    id: str
    hostname: str | None
    last_heartbeat_at: datetime
    metadata: dict[str, Any]
    redis_key_prefix: Annotated[
        str | None,
        msgspec.Meta(
            description="The Redis key prefix (hash tag included) its leases live under; null"
            " for a worker older than the field"
        ),
    ] = None


class WorkersBody(msgspec.Struct, kw_only=True):
    """Workers that heartbeated within the requested window, most recent first."""

    workers: list[WorkerBody]


class HealthBody(msgspec.Struct, kw_only=True):
    """``GET /healthz``: ``checks`` maps each backend to ``"ok"`` or the error seen."""

    status: Literal["ok", "unavailable"]
    checks: dict[str, str]


class ErrorDetail(msgspec.Struct, kw_only=True):
    """What went wrong.

    Attributes:
        code: stable machine-readable code, e.g. ``dependency_cycle``, ``invalid_payload``.
        message: human-readable explanation, safe to show.
        field: the request field at fault (``tasks[0].payload.user``), or null.
    """

    code: str
    message: str
    field: str | None


class ErrorBody(msgspec.Struct, kw_only=True):
    """The one shape of every error response: ``{"error": {"code", "message", "field"}}``."""

    error: ErrorDetail


# --- cancel and manual retry (issue 14 items 1 and 4) ------------------------------------------


class TaskCancelResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/tasks/{id}/cancel``: the task is ``cancelled`` (also when it already was)."""

    task_id: UUID
    status: TaskStatus
    cascaded: Annotated[
        int, msgspec.Meta(description="Pending dependents cancelled with it, transitively")
    ]


class JobCancelResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/jobs/{id}/cancel``: the job's status afterwards and how many of its tasks this
    call cancelled (``cancelled`` stays ``failed`` for a job with a failed task)."""

    job_id: UUID
    status: JobStatus
    cancelled: Annotated[int, msgspec.Meta(description="Tasks this call cancelled")]


class TaskRetryResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/tasks/{id}/retry``: the task's new status (``queued``; ``pending`` while a
    dependency is unfinished) and how many dependents the retry reopened."""

    task_id: UUID
    status: TaskStatus
    reopened: Annotated[
        int,
        msgspec.Meta(description="Dependents failed or cancelled by the cascade, now pending"),
    ]


# --- bulk operations (issue 14 item 6) ----------------------------------------------------------


class BulkRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/tasks/cancel`` and ``POST /v1/tasks/retry``: the ``GET /v1/tasks`` filters as a
    JSON body (all must hold; at least one given), and ``dry_run``."""

    status: Annotated[
        list[str] | str | None,
        msgspec.Meta(
            description="Any of these statuses: a list, or one string (comma-separated allowed)"
        ),
    ] = None
    kind: Annotated[str | None, msgspec.Meta(description="Exactly this kind")] = None
    job_id: Annotated[str | None, msgspec.Meta(description="Tasks of this job (UUID)")] = None
    priority: Annotated[str | None, msgspec.Meta(description="Exactly this priority tier")] = None
    since: Annotated[
        str | None, msgspec.Meta(description="created_at at or after this RFC 3339 time (offset)")
    ] = None
    until: Annotated[
        str | None, msgspec.Meta(description="created_at before this RFC 3339 time (offset)")
    ] = None
    dry_run: Annotated[
        bool, msgspec.Meta(description="Only count the matching tasks; change nothing")
    ] = False


class BulkDryRunBody(msgspec.Struct, kw_only=True):
    """A dry run's answer (200): how many tasks match now; nothing changed."""

    matched: Annotated[int, msgspec.Meta(description="Tasks the filter selects")]
    changed: Annotated[int, msgspec.Meta(description="Always 0 for a dry run")]
    dry_run: bool = True


class OperationBody(msgspec.Struct, kw_only=True):
    """A background bulk operation (202 from ``POST /v1/tasks/cancel|retry``, and
    ``GET /v1/operations/{id}``); the counts grow after each page of up to 500 tasks."""

    id: UUID
    kind: Annotated[str, msgspec.Meta(description="The action: cancel or retry")]
    status: Annotated[
        str,
        msgspec.Meta(
            description="running, succeeded or failed (stopped at `error`; the pages done"
            " before it stay done)"
        ),
    ]
    matched: Annotated[int, msgspec.Meta(description="Matching tasks walked so far")]
    changed: Annotated[int, msgspec.Meta(description="Of those, tasks changed")]
    skipped: Annotated[
        int,
        msgspec.Meta(
            description="Of those, tasks left as they were (status not applicable, changed"
            " meanwhile, or blocked by a failed/cancelled dependency)"
        ),
    ]
    cascaded: Annotated[
        int,
        msgspec.Meta(
            description="Other tasks changed with them (dependents cancelled, or reopened)"
        ),
    ]
    error: str | None
    created_at: datetime
    finished_at: datetime | None


# --- webhooks (issue 16 item 2) ----------------------------------------------------------------


class WebhookRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/webhooks``."""

    url: Annotated[str, msgspec.Meta(description="http:// or https:// url every delivery goes to")]
    events: Annotated[
        list[str], msgspec.Meta(description="Event types to deliver, e.g. job.completed")
    ]
    secret: Annotated[
        str, msgspec.Meta(description="16..256 characters; signs each delivery (write-only)")
    ]


class WebhookBody(msgspec.Struct, kw_only=True):
    """A webhook (never its secret)."""

    id: str
    url: str
    events: list[str]
    created_at: datetime


class WebhookList(msgspec.Struct, kw_only=True):
    """``GET /v1/webhooks``: every webhook, oldest first."""

    webhooks: list[WebhookBody]


class DeliveryLogBody(msgspec.Struct, kw_only=True):
    """A webhook's delivery log: where it is in the outbox and how its last try went."""

    webhook_id: str
    cursor: Annotated[
        str | None,
        msgspec.Meta(description="Event id delivered (or skipped) up to; None before the first"),
    ]
    delivered: Annotated[int, msgspec.Meta(description="Deliveries answered with a 2xx")]
    attempts: Annotated[
        int, msgspec.Meta(description="Failed tries in a row of the next event (0: healthy)")
    ]
    last_status: Annotated[
        int | None, msgspec.Meta(description="HTTP status of the last try; None: no response")
    ]
    last_error: Annotated[str | None, msgspec.Meta(description="Why the last try failed")]
    last_attempt_at: datetime | None
    next_attempt_at: Annotated[
        datetime | None, msgspec.Meta(description="The next try is not before this time")
    ]
