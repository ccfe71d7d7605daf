"""deploy/prometheus/alerts.yml, the operator kit's alerting rules: promtool accepts them alone
and through prometheus.yml's ``rule_files``; ``promtool test rules`` on tests/unit/alerts_test.yml
shows every alert firing on some input and silent on another; every metric an expression reads
is one dtq registers (or Prometheus's own ``up`` of a scrape job prometheus.yml has); and every
rule carries what an operator needs: ``for``, a severity, a summary, a description and a link to
the README's "Alerts" section, which names every alert.

promtool is Debian's ``prometheus`` package; the promtool checks skip without it, except under
``CI=true``, where ``.ci/run`` installs it and its absence is a failure.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.unit.promql import metric_names, registered
from tests.unit.promtool import check_config, check_rules, run_rule_tests

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
RULE_TESTS = Path(__file__).with_name("alerts_test.yml")
README = ROOT / "README.md"

#: Series Prometheus writes itself for every target it scrapes, not registered by dtq.
SCRAPE_SERIES = {"up"}
SEVERITIES = {"critical", "warning"}
RUNBOOK = "README.md#alerts"


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(ALERTS.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def cases() -> list[dict[str, Any]]:
    """Every ``alert_rule_test`` case of alerts_test.yml."""
    loaded = yaml.safe_load(RULE_TESTS.read_text())
    return [case for test in loaded["tests"] for case in test["alert_rule_test"]]


def with_summaries_only(loaded: dict[str, Any]) -> dict[str, Any]:
    """The rule file with each rule's annotations cut down to its summary."""
    for group in loaded["groups"]:
        for rule in group["rules"]:
            rule["annotations"] = {"summary": rule["annotations"]["summary"]}
    return loaded


def said(checked: Any) -> str:
    return str((checked.stdout + checked.stderr).decode())


def test_promtool_accepts_the_alerting_rules() -> None:
    checked = check_rules(ALERTS)

    assert checked.returncode == 0, said(checked)
    assert f"SUCCESS: {len(rules())} rules found" in said(checked)


def test_the_prometheus_config_loads_the_alerting_rules() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())

    checked = check_config(PROMETHEUS_CONFIG)

    assert config["rule_files"] == [ALERTS.name]
    assert checked.returncode == 0, said(checked)
    assert f"Checking {ALERTS}\n  SUCCESS: {len(rules())} rules found" in said(checked)


def test_the_commented_authorization_block_for_metrics_auth_is_valid_once_uncommented(
    tmp_path: Path,
) -> None:
    text = PROMETHEUS_CONFIG.read_text()
    block = ("    # authorization:", "    #   type: Bearer", "    #   credentials_file: ")
    assert all(line in text for line in block), "prometheus.yml lost its METRICS_AUTH example"
    for line in block:
        text = text.replace(line, line.replace("# ", "", 1))
    token = tmp_path / "dtq-read.token"
    token.write_text("dtq_example\n")
    text = text.replace("/etc/prometheus/dtq-read.token", str(token))
    (tmp_path / "prometheus.yml").write_text(text)
    (tmp_path / ALERTS.name).write_text(ALERTS.read_text())

    checked = check_config(tmp_path / "prometheus.yml")
    config = yaml.safe_load(text)

    assert checked.returncode == 0, said(checked)
    orchestrator = next(j for j in config["scrape_configs"] if j["job_name"] == "dtq-orchestrator")
    assert orchestrator["authorization"] == {"type": "Bearer", "credentials_file": str(token)}


def test_every_alert_fires_and_stays_silent_as_its_unit_tests_say(tmp_path: Path) -> None:
    loaded = with_summaries_only(yaml.safe_load(ALERTS.read_text()))
    (tmp_path / ALERTS.name).write_text(yaml.safe_dump(loaded, sort_keys=False))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)

    checked = run_rule_tests(tmp_path / RULE_TESTS.name)

    assert checked.returncode == 0, said(checked)
    assert "SUCCESS" in said(checked)


def test_the_unit_tests_cover_every_alert_firing_and_silent() -> None:
    alerts = {rule["alert"] for rule in rules()}
    firing = {case["alertname"] for case in cases() if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases() if not case.get("exp_alerts")}
    tested = {case["alertname"] for case in cases()}

    assert yaml.safe_load(RULE_TESTS.read_text())["rule_files"] == [ALERTS.name]
    assert tested - alerts == set(), "cases for an alert the rule file does not have"
    assert alerts - firing == set(), "alerts never shown firing"
    assert alerts - silent == set(), "alerts never shown silent"


def test_annotations_name_only_labels_their_alert_carries() -> None:
    carried: dict[str, set[str]] = {}
    for case in cases():
        for alert in case.get("exp_alerts") or []:
            carried.setdefault(case["alertname"], set()).update(alert.get("exp_labels", {}))

    for rule in rules():
        for text in rule["annotations"].values():
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in carried[rule["alert"]], (rule["alert"], label)


def test_every_metric_the_alerts_read_is_registered_by_the_code() -> None:
    series, _ = registered()
    read = set().union(*(metric_names(rule["expr"]) for rule in rules()))

    assert read - SCRAPE_SERIES, "the alerts read no dtq metric"
    assert read - SCRAPE_SERIES - series == set()


def test_the_alerts_name_only_scrape_jobs_of_the_prometheus_config() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    named = {job for rule in rules() for job in re.findall(r'job="([^"]*)"', rule["expr"])}

    assert named, "no alert watches a scrape job's up"
    assert named - jobs == set()


def test_every_rule_says_how_long_how_bad_what_and_where_to_read_more() -> None:
    for rule in rules():
        assert re.fullmatch(r"Dtq[A-Z][A-Za-z]+", rule["alert"]), rule
        assert re.fullmatch(r"[1-9][0-9]*[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, rule["alert"]
        assert annotations["summary"] and len(annotations["description"]) > 100, rule["alert"]
        assert annotations["runbook"] == RUNBOOK, rule["alert"]


def test_the_readme_alerts_section_explains_every_alert() -> None:
    text = README.read_text()
    heading = re.search(r"^### Alerts$", text, re.M)
    assert heading is not None, "README.md has no '### Alerts' section (the runbook link)"
    section = text[heading.end() :].split("\n#", 1)[0]

    for rule in rules():
        assert f"`{rule['alert']}`" in section, rule["alert"]
