"""docker-compose.yml's whole-stack service set (issue 16 item 6): the services, their start order
(crdb and redis healthy -> migrate completed -> orchestrator healthy -> worker), a healthcheck
on every long-running service, nothing but DSNs and dtq settings in the dtq services'
environment, and the monitoring profile's Prometheus scraping both dtq endpoints with its rule
files mounted; plus
``docker compose config -q`` on every compose file where a Compose v2 CLI exists (no Docker
engine is needed for it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dtq.entrypoints.config import ENV_VARS, listen_address
from tests.unit.promtool import check_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_FILES = (COMPOSE_FILE, ROOT / "docker-compose.multinode.yml")

BACKENDS = {"crdb", "redis"}
DTQ_SERVICES = {"migrate", "orchestrator", "worker"}
MONITORING = {"prometheus", "grafana"}
APP_PROFILE = "app"
MONITORING_PROFILE = "monitoring"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"

SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSW|CREDENTIAL|PRIVATE|API_KEY|ACCESS_KEY|^AWS_", re.I)


@cache
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def depends_on(name: str) -> dict[str, str]:
    """``{dependency: condition}`` of a service (the long form of ``depends_on``)."""
    declared = services()[name].get("depends_on", {})
    assert isinstance(declared, dict), f"{name}: depends_on must name a condition per service"
    return {dep: spec["condition"] for dep, spec in declared.items()}


def long_running(name: str) -> bool:
    return services()[name].get("restart") != "no"


def start_stage(name: str) -> int:
    """0 for a service with no dependency, else one more than its latest dependency."""
    deps = depends_on(name)
    return 1 + max(map(start_stage, deps)) if deps else 0


def probe_port(service: dict[str, Any]) -> int:
    """The port a healthcheck command fetches from ``http://127.0.0.1:PORT/...``."""
    command = " ".join(service["healthcheck"]["test"])
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", command)
    assert match is not None, command
    return int(match.group(1))


# --- the service set ------------------------------------------------------------------------------


def test_the_stack_is_the_backends_dtq_and_monitoring() -> None:
    assert set(services()) == BACKENDS | DTQ_SERVICES | MONITORING


def test_plain_up_still_starts_only_the_backends_and_profiles_add_dtq_and_monitoring() -> None:
    for name in BACKENDS:
        assert "profiles" not in services()[name], name
    for name in DTQ_SERVICES:
        assert services()[name]["profiles"] == [APP_PROFILE], name
    for name in MONITORING:
        assert services()[name]["profiles"] == [MONITORING_PROFILE], name


def test_every_dtq_service_runs_the_one_image_built_from_the_dockerfile_with_the_examples() -> None:
    images = {services()[name]["image"] for name in DTQ_SERVICES}
    builds = [services()[name]["build"] for name in DTQ_SERVICES]

    assert len(images) == 1
    for build in builds:
        assert build["context"] == "."
        assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
        assert build["args"]["DTQ_EXTRAS"] == "examples"


def test_the_dtq_services_run_migrate_orchestrator_and_the_example_worker() -> None:
    assert services()["migrate"]["command"] == ["migrate"]
    assert services()["orchestrator"]["command"] == ["orchestrator"]
    worker = services()["worker"]["command"]
    assert worker[:2] == ["worker", "--app"]
    module, _, attribute = worker[2].partition(":")
    source = ROOT / (module.replace(".", "/") + ".py")
    assert source.is_file(), worker[2]
    assert re.search(rf"^{attribute} = Runtime\(", source.read_text(), re.M), worker[2]


# --- start order ----------------------------------------------------------------------------------


def test_migrate_waits_for_a_healthy_database_and_runs_once() -> None:
    assert depends_on("migrate") == {"crdb": "service_healthy"}
    assert services()["migrate"]["restart"] == "no"


def test_the_orchestrator_waits_for_healthy_backends_and_a_completed_migrate() -> None:
    assert depends_on("orchestrator") == {
        "crdb": "service_healthy",
        "redis": "service_healthy",
        "migrate": "service_completed_successfully",
    }


def test_the_worker_waits_for_a_healthy_orchestrator() -> None:
    deps = depends_on("worker")

    assert deps["orchestrator"] == "service_healthy"
    assert deps.get("migrate", "service_completed_successfully") == (
        "service_completed_successfully"
    )


def test_start_order_is_backends_then_migrate_then_orchestrator_then_worker() -> None:
    stages = {name: start_stage(name) for name in services()}

    assert stages == {
        "crdb": 0,
        "redis": 0,
        "migrate": 1,
        "orchestrator": 2,
        "worker": 3,
        "prometheus": 0,
        "grafana": 1,
    }


def test_a_dependency_on_a_long_running_service_waits_for_its_health_a_one_shot_for_success() -> (
    None
):
    for name in services():
        for dep, condition in depends_on(name).items():
            wanted = "service_healthy" if long_running(dep) else "service_completed_successfully"
            assert condition == wanted, f"{name} -> {dep}"


# --- healthchecks ---------------------------------------------------------------------------------


def test_every_long_running_service_has_a_healthcheck() -> None:
    for name, service in services().items():
        if long_running(name):
            test = service.get("healthcheck", {}).get("test")
            assert test and test[0] in {"CMD", "CMD-SHELL"}, name
            assert not service["healthcheck"].get("disable", False), name


def test_the_orchestrator_is_healthy_when_its_healthz_answers_on_its_listen_port() -> None:
    orchestrator = services()["orchestrator"]
    _, port = listen_address(orchestrator["environment"]["ORCHESTRATOR_LISTEN"])

    assert "/healthz" in " ".join(orchestrator["healthcheck"]["test"])
    assert probe_port(orchestrator) == port
    assert f"{port}:{port}" in orchestrator["ports"]


def test_the_worker_is_healthy_when_its_metrics_endpoint_answers() -> None:
    worker = services()["worker"]
    _, port = listen_address(worker["environment"]["WORKER_METRICS_LISTEN"])

    assert probe_port(worker) == port


# --- environment ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DTQ_SERVICES))
def test_dtq_services_set_only_dtq_settings_and_no_secrets(name: str) -> None:
    environment = services()[name]["environment"]
    assert isinstance(environment, dict), "environment as a mapping, so it can be checked"

    assert set(environment) <= set(ENV_VARS)
    assert not [key for key in environment if SECRET_NAME.search(key)]
    assert urlsplit(environment["CRDB_DSN"]).password is None


def test_the_worker_needs_nothing_but_the_dsns_and_its_metrics_address() -> None:
    environment = services()["worker"]["environment"]

    assert set(environment) - {"LOG_FORMAT"} == {"CRDB_DSN", "REDIS_ADDR", "WORKER_METRICS_LISTEN"}


def test_the_orchestrator_and_the_worker_share_the_artifact_volume() -> None:
    """The top-k example's stitch writes its CSV on the worker; the orchestrator serves it."""
    mounts = {name: set(services()[name].get("volumes", [])) for name in ("orchestrator", "worker")}

    shared = mounts["orchestrator"] & mounts["worker"]
    assert any(mount.split(":")[0] in compose()["volumes"] for mount in shared)


def comment_above(line: str) -> str:
    """The comment lines right above the first line of the compose file that reads ``line``."""
    lines = [text.strip() for text in COMPOSE_FILE.read_text().splitlines()]
    above: list[str] = []
    for text in reversed(lines[: lines.index(line)]):
        if not text.startswith("#"):
            break
        above.insert(0, text.lstrip("# "))
    return " ".join(above)


def test_local_stack_turns_api_auth_off_on_the_orchestrator_and_says_what_production_does() -> None:
    assert services()["orchestrator"]["environment"]["API_AUTH"] == "none"
    note = comment_above("API_AUTH: none")
    assert "production" in note
    assert "token" in note


# --- monitoring -----------------------------------------------------------------------------------


def scrape_targets() -> dict[str, set[str]]:
    """``{job_name: {"host:port", ...}}`` of deploy/prometheus/prometheus.yml."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets: dict[str, set[str]] = {}
    for job in config["scrape_configs"]:
        found = targets.setdefault(job["job_name"], set())
        for static in job.get("static_configs", []):
            found.update(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            found.update(f"{name}:{dns['port']}" for name in dns["names"])
    return targets


def test_prometheus_scrapes_the_orchestrator_and_every_worker_on_their_ports() -> None:
    _, api_port = listen_address(services()["orchestrator"]["environment"]["ORCHESTRATOR_LISTEN"])
    _, worker_port = listen_address(services()["worker"]["environment"]["WORKER_METRICS_LISTEN"])

    assert scrape_targets() == {
        "dtq-orchestrator": {f"orchestrator:{api_port}"},
        "dtq-worker": {f"worker:{worker_port}"},
    }
    mounts = services()["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_prometheus_mounts_its_rule_files_next_to_its_config() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    mounts = services()["prometheus"]["volumes"]

    assert config["rule_files"], "prometheus.yml loads no rule file"
    for name in config["rule_files"]:
        source = f"./deploy/prometheus/{name}"
        assert (ROOT / source).is_file(), source
        assert f"{source}:/etc/prometheus/{name}:ro" in mounts


def test_promtool_accepts_the_prometheus_config() -> None:
    checked = check_config(PROMETHEUS_CONFIG)

    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()


def test_grafana_mounts_the_dashboard_and_its_provisioning_from_deploy() -> None:
    mounts = [mount.split(":") for mount in services()["grafana"]["volumes"]]
    sources = {target: source for source, target, *_ in mounts}

    assert sources["/var/lib/grafana/dashboards/dtq.json"] == "./deploy/grafana/dtq.json"
    for source in sources.values():
        assert (ROOT / source).exists(), source
    provisioned = ROOT / sources["/etc/grafana/provisioning"]
    dashboards = yaml.safe_load((provisioned / "dashboards" / "dtq.yml").read_text())
    assert dashboards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    datasources = yaml.safe_load((provisioned / "datasources" / "prometheus.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"


# --- docker compose config ------------------------------------------------------------------------


def compose_cli() -> list[str] | None:
    """A Compose v2 command line (``docker compose`` or a v2 ``docker-compose``), or None.

    Compose v1 (``docker-compose`` 1.x, Debian bookworm's) does not count: it rejects the
    top-level ``name`` of the Compose specification that both files use.
    """
    candidates = []
    if shutil.which("docker"):
        candidates.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    for command in candidates:
        version = subprocess.run(
            [*command, "version", "--short"], capture_output=True, text=True, check=False
        )
        if version.returncode == 0 and version.stdout.strip().lstrip("v").startswith("2"):
            return command
    return None


@pytest.mark.parametrize(
    ("path", "profiles"),
    [
        (COMPOSE_FILE, ()),
        (COMPOSE_FILE, (APP_PROFILE,)),
        (COMPOSE_FILE, (APP_PROFILE, MONITORING_PROFILE)),
        (COMPOSE_FILES[1], ()),
    ],
    ids=["base", "app", "app-monitoring", "multinode"],
)
def test_docker_compose_config_accepts_the_file(path: Path, profiles: tuple[str, ...]) -> None:
    command = compose_cli()
    if command is None:
        pytest.skip(
            "no Compose v2 CLI (the docker CLI has no compose plugin, no v2 docker-compose)"
        )
    options = [option for profile in profiles for option in ("--profile", profile)]

    checked = subprocess.run(
        [*command, "-f", str(path), *options, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )

    assert checked.returncode == 0, checked.stderr
    assert checked.stderr.strip() == ""
