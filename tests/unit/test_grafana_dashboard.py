"""deploy/grafana/dtq.json (issue 16 item 6) stays true to the code: every metric its PromQL
expressions name is one the orchestrator or the worker registers, every ``orchestrator_*`` and
``worker_*`` metric is on some panel, and promtool parses every expression.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.unit.promql import family_of, metric_names, registered
from tests.unit.promtool import check_rules

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dtq.json"

#: Grafana's interval variables, replaced by a duration for promtool.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)")


def load() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def panels(node: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in (node or load()).get("panels", []):
        yield panel
        yield from panels(panel)


def expressions() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel.get("targets", [])]


def test_the_dashboard_names_its_data_source_as_a_variable_for_import() -> None:
    dashboard = load()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}

    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels():
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]


def test_panel_ids_are_unique_and_every_panel_has_a_place_and_a_title() -> None:
    ids = [panel["id"] for panel in panels()]

    assert len(ids) == len(set(ids))
    for panel in panels():
        assert panel["title"]
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_every_metric_the_dashboard_queries_is_registered_by_the_code() -> None:
    series, _ = registered()
    queried = set().union(*map(metric_names, expressions()))

    assert queried, "the dashboard queries no metric"
    assert queried - series == set()


def test_every_orchestrator_and_worker_metric_is_on_the_dashboard() -> None:
    _, families = registered()
    shown = {family_of(name, families) for expr in expressions() for name in metric_names(expr)}

    assert families - shown == set()


def test_the_metric_name_reader_skips_functions_labels_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, route) (rate(a_seconds_bucket{status=~"5.."}[5m])))'
        " / clamp_min(sum(rate(b_total[$__rate_interval])), 1e-9) or vector(0)"
    )

    assert metric_names(expr) == {"a_seconds_bucket", "b_total"}


def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    rules = [
        {"record": f"dtq:dashboard:expr{index}", "expr": GRAFANA_INTERVALS.sub("5m", expr)}
        for index, expr in enumerate(expressions())
    ]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dtq-dashboard", "rules": rules}]}))

    checked = check_rules(path)

    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
