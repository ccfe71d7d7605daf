"""Reading PromQL for the operator kit's tests: the metric names an expression selects, and the
series the code registers, so the dashboard (``deploy/grafana/dtq.json``) and the alerting rules
(``deploy/prometheus/alerts.yml``) can be held to the metrics dtq really exports."""

from __future__ import annotations

import re

from dtq.entrypoints.metrics import OrchestratorMetrics, WorkerMetrics, new_registry

#: PromQL words that look like metric names: keywords, aggregation modifiers, functions.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_WORDS |= {"and", "or", "unless", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue
        before = text[: match.start()]
        if re.search(r"[0-9.]$", before):  # the exponent of a number such as 1e-9
            continue
        names.add(match.group())
    return names


def registered() -> tuple[set[str], set[str]]:
    """(every series name the code can expose, the orchestrator_*/worker_* metric families)."""
    registry = new_registry()
    OrchestratorMetrics(registry)
    WorkerMetrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    series: set[str] = set()
    families: set[str] = set()
    for family in registry.collect():
        series.update(sample.name for sample in family.samples)
        series.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        if family.name.startswith(("orchestrator_", "worker_")):
            families.add(family.name)
    return series, families


def family_of(series: str, families: set[str]) -> str | None:
    """The metric family a series name belongs to (``x_total`` -> ``x``), or None."""
    for suffix in ("_total", "_bucket", "_sum", "_count", ""):
        name = series.removesuffix(suffix) if suffix else series
        if name in families:
            return name
    return None
