"""Jinja filters of the dashboard's templates: times, durations, JSON values, webhook urls."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import Environment

from dtq.domain.webhooks import shown_url

#: Characters of a JSON value shown before it is cut (payloads and results can be large).
JSON_CHARS = 20_000


def when(value: datetime | None) -> str:
    """``2026-12-01 13:05:09`` (UTC); an empty string for None."""
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def took(start: datetime | None, end: datetime | None) -> str:
    """``1.25 s`` between two instants; empty when either is missing."""
    if start is None or end is None:
        return ""
    return f"{(end - start).total_seconds():.2f} s"


def pretty(value: Any) -> str:
    """``value`` as indented JSON, cut at ``JSON_CHARS`` characters."""
    text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    return text if len(text) <= JSON_CHARS else text[:JSON_CHARS] + "\n… (cut)"


def short(value: object) -> str:
    """The first 8 characters of an id."""
    return str(value)[:8]


def install_filters(env: Environment) -> None:
    """Register the filters on the dashboard's Jinja environment."""
    env.filters.update(when=when, took=took, pretty=pretty, short=short, shown_url=shown_url)
