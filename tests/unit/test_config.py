"""Configuration: spec §8 variables, defaults, Go durations, validation naming the variable."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

import pytest

from dtq.application.commands import ExecutionPolicy
from dtq.entrypoints import cli, eventloop
from dtq.entrypoints.cli import common as cli_common
from dtq.entrypoints.config import (
    ENV_VARS,
    ConfigError,
    Settings,
    listen_address,
    load_dotenv_file,
    load_settings,
    parse_duration,
)

REPO = Path(__file__).resolve().parents[2]


def test_defaults_match_the_spec_table() -> None:
    s = load_settings({})

    assert s.crdb_dsn is None
    assert s.redis_addr == "127.0.0.1:6379"
    assert s.redis_key_prefix == "dto:"
    assert s.orchestrator_listen == ":8080"
    assert s.reconcile_interval == 30.0
    assert s.lease_duration == 30.0
    assert s.stale_running_after == 60.0
    assert s.worker_concurrency == 1
    assert s.worker_heartbeat_interval == 30.0
    assert s.retry_backoff == 5.0
    assert s.pending_marker_ttl == 15.0
    assert s.max_reclaims == 5
    assert s.promote_interval == pytest.approx(0.025)
    assert s.reconcile_batch == 500
    assert s.worker_metrics_listen is None
    assert s.log_format == "auto"
    assert s.log_level == "info"
    assert s.api_max_body_bytes == 10 * 1024 * 1024
    assert s.api_max_tasks_per_job == 10_000
    assert s.api_max_payload_bytes == 256 * 1024
    assert s.db_pool_size == 8
    assert s.db_acquire_timeout == 3.0


def test_settings_constructor_defaults_equal_loaded_defaults() -> None:
    loaded = load_settings({"WORKER_ID": "w"})
    built = Settings(worker_id="w")

    assert loaded == built


def test_worker_id_defaults_to_a_fresh_uuid() -> None:
    first = load_settings({}).worker_id
    second = load_settings({}).worker_id

    assert uuid.UUID(first) != uuid.UUID(second)


def test_every_variable_is_parsed() -> None:
    env = {
        "CRDB_DSN": "postgresql://root@db:26257/defaultdb?sslmode=disable",
        "REDIS_ADDR": "redis.internal:6380",
        "REDIS_KEY_PREFIX": "staging:",
        "ORCHESTRATOR_LISTEN": "127.0.0.1:9000",
        "RECONCILE_INTERVAL": "5s",
        "LEASE_DURATION": "10s",
        "STALE_RUNNING_AFTER": "45s",
        "WORKER_ID": "worker-7",
        "WORKER_CONCURRENCY": "4",
        "WORKER_HEARTBEAT_INTERVAL": "2s",
        "RETRY_BACKOFF": "750ms",
        "PENDING_MARKER_TTL": "2m",
        "MAX_RECLAIMS": "0",
        "PROMOTE_INTERVAL": "250ms",
        "RECONCILE_BATCH": "100",
        "WORKER_METRICS_LISTEN": ":9100",
        "LOG_FORMAT": "JSON",
        "LOG_LEVEL": "Debug",
        "API_MAX_BODY_BYTES": "2048",
        "API_MAX_TASKS_PER_JOB": "50",
        "API_MAX_PAYLOAD_BYTES": "1024",
        "API_MAX_RESULT_BYTES": "4096",
        "DB_POOL_SIZE": "3",
        "DB_ACQUIRE_TIMEOUT": "1500ms",
        "REDIS_PUSH_TRIAL_TIMEOUT": "800ms",
        "DTQ_EVENT_LOOP": "asyncio",
        "ARTIFACT_BACKEND": "S3",
        "ARTIFACT_DIR": "/srv/artifacts",
        "ARTIFACT_S3_BUCKET": "dtq-artifacts",
        "ARTIFACT_S3_ENDPOINT": "http://127.0.0.1:8333",
        "API_MAX_ARTIFACT_BYTES": "1048576",
        "API_AUTH": "None",
        "METRICS_AUTH": "yes",
        "RETENTION_COMPLETED": "24h",
        "RETENTION_FAILED": "0",
        "IDEMPOTENCY_KEY_TTL": "1h30m",
        "DTQ_TOKEN": "secret",
        "EVENTS_SETTLE": "2s",
        "EVENTS_POLL_INTERVAL": "100ms",
        "WEBHOOK_TIMEOUT": "3s",
        "WEBHOOK_BACKOFF_MIN": "500ms",
        "WEBHOOK_BACKOFF_MAX": "1m",
        "WEBHOOK_POLL_INTERVAL": "2s",
    }
    assert set(env) == set(ENV_VARS)

    s = load_settings(env)

    assert s == Settings(
        crdb_dsn="postgresql://root@db:26257/defaultdb?sslmode=disable",
        redis_addr="redis.internal:6380",
        redis_key_prefix="staging:",
        orchestrator_listen="127.0.0.1:9000",
        reconcile_interval=5.0,
        lease_duration=10.0,
        stale_running_after=45.0,
        worker_id="worker-7",
        worker_concurrency=4,
        worker_heartbeat_interval=2.0,
        retry_backoff=0.75,
        pending_marker_ttl=120.0,
        max_reclaims=0,
        promote_interval=0.25,
        reconcile_batch=100,
        worker_metrics_listen=":9100",
        log_format="json",
        log_level="debug",
        api_max_body_bytes=2048,
        api_max_tasks_per_job=50,
        api_max_payload_bytes=1024,
        api_max_result_bytes=4096,
        db_pool_size=3,
        db_acquire_timeout=1.5,
        redis_push_trial_timeout=0.8,
        artifact_backend="s3",
        artifact_dir=Path("/srv/artifacts"),
        artifact_s3_bucket="dtq-artifacts",
        artifact_s3_endpoint="http://127.0.0.1:8333",
        api_max_artifact_bytes=1048576,
        api_auth="none",
        metrics_auth=True,
        retention_completed=86400.0,
        retention_failed=0.0,
        idempotency_key_ttl=5400.0,
        dtq_token="secret",
        events_settle=2.0,
        events_poll_interval=0.1,
        webhook_timeout=3.0,
        webhook_backoff_min=0.5,
        webhook_backoff_max=60.0,
        webhook_poll_interval=2.0,
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30.0),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("1m30s500ms", 90.5),
        ("250us", 0.00025),
    ],
)
def test_go_durations_are_parsed_to_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text, variable="X") == pytest.approx(seconds)
    assert load_settings({"RETRY_BACKOFF": text}).retry_backoff == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["30", "1d", "abc", "1h-5m", "s", "5 s", "1.2.3s", "\uff130s", "1.\uff15s"]
)
def test_non_go_durations_are_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"RECONCILE_INTERVAL": text})

    assert caught.value.variable == "RECONCILE_INTERVAL"
    assert str(caught.value).startswith("RECONCILE_INTERVAL: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "variable",
    [
        "RECONCILE_INTERVAL",
        "LEASE_DURATION",
        "STALE_RUNNING_AFTER",
        "RETRY_BACKOFF",
        "PENDING_MARKER_TTL",
        "PROMOTE_INTERVAL",
    ],
)
@pytest.mark.parametrize("text", ["0s", "0", "-5s"])
def test_zero_and_negative_durations_are_refused(variable: str, text: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}: must be a positive duration"):
        load_settings({variable: text})


def test_a_duration_below_a_microsecond_says_so() -> None:
    """1ns is positive, but below the microsecond every duration is counted in."""
    with pytest.raises(ConfigError) as caught:
        load_settings({"RECONCILE_INTERVAL": "1ns"})

    assert caught.value.message == (
        "must be at least 1us (durations count whole microseconds), got '1ns'"
    )


@pytest.mark.parametrize("text", ["1ms", "999ms", "1us"])
def test_a_lease_under_a_second_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^LEASE_DURATION: must be at least 1s"):
        load_settings({"LEASE_DURATION": text})
    assert load_settings({"LEASE_DURATION": "1s"}).lease_duration == 1.0


def test_stale_running_after_defaults_to_twice_the_lease_duration() -> None:
    assert load_settings({"LEASE_DURATION": "10s"}).stale_running_after == 20.0
    assert load_settings({"LEASE_DURATION": "1h30m"}).stale_running_after == 3 * 3600.0


def test_explicit_stale_running_after_wins_over_the_derived_default() -> None:
    s = load_settings({"LEASE_DURATION": "10s", "STALE_RUNNING_AFTER": "15s"})

    assert s.stale_running_after == 15.0


def test_worker_heartbeat_interval_below_one_second_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^WORKER_HEARTBEAT_INTERVAL: must be at least 1s"):
        load_settings({"WORKER_HEARTBEAT_INTERVAL": "999ms"})


def test_worker_heartbeat_interval_of_exactly_one_second_is_accepted() -> None:
    assert load_settings({"WORKER_HEARTBEAT_INTERVAL": "1s"}).worker_heartbeat_interval == 1.0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WORKER_CONCURRENCY", "0"),
        ("WORKER_CONCURRENCY", "two"),
        ("WORKER_CONCURRENCY", "\u0661"),  # Unicode digits: int() takes them, Go does not
        ("DB_POOL_SIZE", "\uff18"),
        ("MAX_RECLAIMS", "1_0"),
        ("MAX_RECLAIMS", "-1"),
        ("RECONCILE_BATCH", "0"),
        ("API_MAX_BODY_BYTES", "0"),
        ("API_MAX_BODY_BYTES", "10MiB"),
        ("API_MAX_TASKS_PER_JOB", "-3"),
        ("API_MAX_PAYLOAD_BYTES", "1.5"),
        ("DB_POOL_SIZE", "0"),
        ("ORCHESTRATOR_LISTEN", "8080"),
        ("ORCHESTRATOR_LISTEN", ":http"),
        ("ORCHESTRATOR_LISTEN", ":70000"),
        ("ORCHESTRATOR_LISTEN", ":\uff18080"),
        ("WORKER_METRICS_LISTEN", "localhost"),
        ("LOG_FORMAT", "xml"),
        ("LOG_LEVEL", "verbose"),
        ("REDIS_ADDR", "redis host:6379"),
    ],
)
def test_bad_values_raise_config_error_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({variable: value})

    error = caught.value
    assert error.variable == variable
    assert str(error) == f"{variable}: {error.message}"
    assert "\n" not in str(error)


def test_empty_values_count_as_unset() -> None:
    s = load_settings({"LEASE_DURATION": "", "WORKER_ID": "  ", "CRDB_DSN": ""})

    assert s.lease_duration == 30.0
    assert s.crdb_dsn is None
    assert uuid.UUID(s.worker_id)


def test_require_dsn_names_crdb_dsn_when_it_is_missing() -> None:
    with pytest.raises(ConfigError, match=r"^CRDB_DSN: required"):
        load_settings({}).require_dsn()

    assert load_settings({"CRDB_DSN": "postgresql://x/y"}).require_dsn() == "postgresql://x/y"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (":8080", ("0.0.0.0", 8080)),
        ("127.0.0.1:9000", ("127.0.0.1", 9000)),
        ("localhost:80", ("localhost", 80)),
        ("[::1]:8081", ("::1", 8081)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
    ],
)
def test_listen_address_splits_host_and_port(value: str, expected: tuple[str, int]) -> None:
    assert listen_address(value) == expected


def test_execution_policy_carries_the_configured_timings() -> None:
    s = load_settings(
        {
            "LEASE_DURATION": "12s",
            "RETRY_BACKOFF": "3s",
            "STALE_RUNNING_AFTER": "40s",
            "MAX_RECLAIMS": "2",
        }
    )

    policy = s.execution_policy()

    assert isinstance(policy, ExecutionPolicy)
    assert policy.lease_duration == 12.0
    assert policy.retry_backoff == 3.0
    assert policy.stale_running_after == 40.0
    assert policy.max_reclaims == 2


def test_dotenv_values_lose_to_the_real_environment(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "LEASE_DURATION=10s\nREDIS_ADDR=from-file:6379\n# a comment\nWORKER_ID=file-worker\n",
        encoding="utf-8",
    )

    merged = load_dotenv_file(env_file, environ={"REDIS_ADDR": "from-env:6379"})
    s = load_settings(merged)

    assert s.redis_addr == "from-env:6379"
    assert s.lease_duration == 10.0
    assert s.worker_id == "file-worker"


def test_a_missing_dotenv_file_yields_the_environment(tmp_path: Path) -> None:
    merged = load_dotenv_file(tmp_path / "absent.env", environ={"LOG_LEVEL": "error"})

    assert merged == {"LOG_LEVEL": "error"}


def test_env_example_lists_every_variable() -> None:
    example = (REPO / ".env.example").read_text(encoding="utf-8")
    named = {
        line.lstrip("# ").split("=", 1)[0]
        for line in example.splitlines()
        if "=" in line and line.lstrip("# ").split("=", 1)[0].isupper()
    }

    assert set(ENV_VARS) <= named


def test_env_example_values_load() -> None:
    merged = load_dotenv_file(REPO / ".env.example", environ={})

    load_settings(merged)


@pytest.mark.parametrize("dsn", ["notadsn", "http://x", "mysql://a@b/c", "postgresql://[::1"])
def test_a_malformed_dsn_is_refused_in_one_line(dsn: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings(crdb_dsn=dsn).require_dsn()
    assert err.value.variable == "CRDB_DSN"
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "dsn", ["postgresql://root@127.0.0.1:26257/defaultdb?sslmode=disable", "host=db dbname=x"]
)
def test_url_and_keyword_dsns_are_accepted(dsn: str) -> None:
    assert Settings(crdb_dsn=dsn).require_dsn() == dsn


DURATION_VARIABLES = [
    "RECONCILE_INTERVAL",
    "LEASE_DURATION",
    "STALE_RUNNING_AFTER",
    "WORKER_HEARTBEAT_INTERVAL",
    "RETRY_BACKOFF",
    "PENDING_MARKER_TTL",
    "PROMOTE_INTERVAL",
    "DB_ACQUIRE_TIMEOUT",
    "REDIS_PUSH_TRIAL_TIMEOUT",
]


@pytest.mark.parametrize("variable", DURATION_VARIABLES)
def test_durations_beyond_the_range_are_refused_naming_the_variable(variable: str) -> None:
    env = {variable: "999999999h"}
    if variable == "STALE_RUNNING_AFTER":
        env["LEASE_DURATION"] = "1h"
    with pytest.raises(ConfigError, match=f"^{variable}: must be at most "):
        load_settings(env)


def test_the_longest_accepted_duration_is_a_week() -> None:
    s = load_settings({"LEASE_DURATION": "168h", "RETRY_BACKOFF": "168h"})

    assert s.lease_duration == 7 * 24 * 3600.0
    with pytest.raises(ConfigError, match=r"^RETRY_BACKOFF: must be at most 168h, got '169h'$"):
        load_settings({"RETRY_BACKOFF": "169h"})


def test_db_acquire_timeout_is_capped_at_a_minute() -> None:
    assert load_settings({"DB_ACQUIRE_TIMEOUT": "60s"}).db_acquire_timeout == 60.0
    with pytest.raises(ConfigError, match=r"^DB_ACQUIRE_TIMEOUT: must be at most 60s"):
        load_settings({"DB_ACQUIRE_TIMEOUT": "61s"})


def test_the_push_trial_timeout_is_capped_at_the_redis_reply_timeout() -> None:
    assert load_settings({}).redis_push_trial_timeout == 0.5
    assert load_settings({"REDIS_PUSH_TRIAL_TIMEOUT": "3s"}).redis_push_trial_timeout == 3.0
    with pytest.raises(ConfigError, match=r"^REDIS_PUSH_TRIAL_TIMEOUT: must be at most 3s"):
        load_settings({"REDIS_PUSH_TRIAL_TIMEOUT": "3100ms"})


def test_stale_running_after_below_the_lease_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"LEASE_DURATION": "30s", "STALE_RUNNING_AFTER": "10s"})

    assert caught.value.variable == "STALE_RUNNING_AFTER"
    assert "LEASE_DURATION (30s)" in caught.value.message
    assert load_settings({"LEASE_DURATION": "2s", "STALE_RUNNING_AFTER": "2s"}).stale_running_after


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:99999",
        "127.0.0.1:0",
        "127.0.0.1:-1",
        "garbage",
        ":6379",
        "host:port",
        "host:6379/0",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:99999/0",
        "[::1",
        "redis://[::1",
        "redis+cluster://[::1",
        "redis://127.0.0.1:6379/0?foo=bar",
        "unix:///run/redis.sock?foo=bar",
        "redis://127.0.0.1:6379?socket_timeout=abc",
        "redis://127.0.0.1:6379/-1",
        "redis://127.0.0.1:6379/abc",
        "redis://127.0.0.1:6379/0/1",
        "redis://127.0.0.1:6379?db=-1",
        "redis://127.0.0.1:6379?decode_responses=true",
    ],
)
def test_unusable_redis_addresses_are_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"REDIS_ADDR": value})

    assert caught.value.variable == "REDIS_ADDR"
    assert repr(value) in caught.value.message
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:6379",
        "redis.internal:6380",
        "[::1]:6379",
        "redis://h/0",
        "rediss://u:p@h:6380/1",
        "unix:///run/redis.sock",
        "unix:///run/redis.sock?db=2",
        "redis://h:6379/",
        "redis://h:6379?socket_timeout=5&health_check_interval=10",
        "redis://h:6379/3?protocol=3",
    ],
)
def test_usable_redis_addresses_are_accepted(value: str) -> None:
    assert load_settings({"REDIS_ADDR": value}).redis_addr == value


def test_an_unknown_redis_url_option_is_named() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"REDIS_ADDR": "redis://127.0.0.1:6379/0?foo=bar"})

    assert "unknown URL option 'foo'" in caught.value.message


@pytest.mark.parametrize(
    "dsn", ["postgresql://u@h/db?sslmode=bogus", "host=h dbname=x sslmode=Disable"]
)
def test_an_unknown_sslmode_is_refused_at_once(dsn: str) -> None:
    with pytest.raises(ConfigError, match=r"^CRDB_DSN: sslmode must be one of disable\|allow"):
        Settings(crdb_dsn=dsn).require_dsn()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ARTIFACT_BACKEND": "ftp"}, "ARTIFACT_BACKEND: must be one of fs|s3, got 'ftp'"),
        ({"ARTIFACT_BACKEND": "s3"}, "ARTIFACT_S3_BUCKET: required when ARTIFACT_BACKEND=s3"),
        (
            {"ARTIFACT_S3_ENDPOINT": "127.0.0.1:8333"},
            "ARTIFACT_S3_ENDPOINT: must be an http(s):// URL, got '127.0.0.1:8333'",
        ),
        (
            {"ARTIFACT_S3_ENDPOINT": "http://[::1"},
            "ARTIFACT_S3_ENDPOINT: must be an http(s):// URL, got 'http://[::1'",
        ),
        ({"API_MAX_ARTIFACT_BYTES": "0"}, "API_MAX_ARTIFACT_BYTES: must be at least 1, got 0"),
        ({"API_MAX_ARTIFACT_BYTES": "2TB"}, "API_MAX_ARTIFACT_BYTES: must be an integer"),
    ],
)
def test_bad_artifact_settings_are_one_line_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_artifact_settings_default_to_a_directory() -> None:
    s = load_settings({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "secret"})
    assert (s.artifact_backend, s.artifact_dir, s.api_max_artifact_bytes) == ("fs", None, 256 << 20)
    assert s.artifact_s3_credentials == ("k", "secret", "us-east-1")
    assert "secret" not in repr(s)


def test_the_event_loop_variable_is_listed_with_the_others() -> None:
    assert eventloop.EVENT_LOOP_ENV in ENV_VARS


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LEASE_DURATION", "999999999h"),
        ("REDIS_ADDR", "127.0.0.1:99999"),
        ("REDIS_ADDR", "garbage"),
        ("CRDB_DSN", "postgresql://postgres@127.0.0.1:1/postgres?sslmode=bogus"),
        ("STALE_RUNNING_AFTER", "1s"),
        ("RECONCILE_BATCH", "99999999999999999999"),
        ("RETENTION_FAILED", "-1h"),
    ],
)
def test_the_cli_refuses_bad_configuration_in_one_line_with_exit_2(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(REPO / "tests")  # no .env there
    monkeypatch.setattr(cli_common, "configure_logging", lambda fmt, level: None)
    # A port nothing listens on: were the bad value accepted, the start would fail differently.
    monkeypatch.setenv("CRDB_DSN", "postgresql://postgres@127.0.0.1:1/postgres")
    monkeypatch.setenv("DB_ACQUIRE_TIMEOUT", "1s")
    monkeypatch.setenv(variable, value)

    status = cli.main(["orchestrator"])

    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"dtq: {variable}: "), err


INTEGER_VARIABLES = [
    "WORKER_CONCURRENCY",
    "MAX_RECLAIMS",
    "RECONCILE_BATCH",
    "API_MAX_BODY_BYTES",
    "API_MAX_TASKS_PER_JOB",
    "API_MAX_PAYLOAD_BYTES",
    "API_MAX_RESULT_BYTES",
    "API_MAX_ARTIFACT_BYTES",
    "DB_POOL_SIZE",
]


@pytest.mark.parametrize("variable", INTEGER_VARIABLES)
@pytest.mark.parametrize("value", ["99999999999999999999", "9223372036854775807", "9" * 5000])
def test_huge_integers_are_refused_naming_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}: must be at most ") as caught:
        load_settings({variable: value})

    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_every_integer_variable_is_bounded_and_listed() -> None:
    assert set(INTEGER_VARIABLES) == {
        name
        for name in ENV_VARS
        if type(getattr(Settings(), name.lower(), None)) is int  # not METRICS_AUTH's bool
    }


@pytest.mark.parametrize("text", ["\u0661", "\uff18080", "1_0"])
def test_cli_integer_options_take_ascii_digits_only(text: str) -> None:
    for parse in (cli_common.positive_int, cli_common.port):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
    assert (cli_common.positive_int("8"), cli_common.port("8080")) == (8, 8080)


@pytest.mark.parametrize("value", ["-" + "9" * 5000, "x" * 5000])
def test_a_huge_bad_integer_is_refused_in_a_short_line(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^MAX_RECLAIMS: must be (at least 0|an integer)") as e:
        load_settings({"MAX_RECLAIMS": value})

    assert len(str(e.value)) < 120


# --- retention (issue 14 item 8) --------------------------------------------------------------


def test_retention_settings_default_to_7_30_and_7_days() -> None:
    s = load_settings({})
    assert (s.retention_completed, s.retention_failed, s.idempotency_key_ttl) == (
        7 * 86400.0,
        30 * 86400.0,
        7 * 86400.0,
    )
    assert s.retention_policy().failed == 30 * 86400.0


def test_retention_settings_take_zero_to_disable() -> None:
    s = load_settings({"RETENTION_COMPLETED": "0", "IDEMPOTENCY_KEY_TTL": "0s"})
    assert (s.retention_completed, s.idempotency_key_ttl) == (0.0, 0.0)


@pytest.mark.parametrize(
    "variable", ["RETENTION_COMPLETED", "RETENTION_FAILED", "IDEMPOTENCY_KEY_TTL"]
)
@pytest.mark.parametrize(
    ("value", "message"),
    [("-1h", "must not be negative"), ("7d", "not a duration"), ("87601h", "must be at most")],
)
def test_bad_retention_settings_are_refused_naming_the_variable(
    variable: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{variable}: {message}"):
        load_settings({variable: value})


def test_a_refused_boolean_lists_every_spelling_taken() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({"METRICS_AUTH": "maybe"})

    assert caught.value.message == (
        "must be one of true|false (or 1, yes, on, 0, no, off; any case), got 'maybe'"
    )
    assert load_settings({"METRICS_AUTH": "YES"}).metrics_auth is True
