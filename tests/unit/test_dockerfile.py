"""The Dockerfile and .dockerignore (issue 16 item 6), read statically: no Docker engine runs on
our build machines. A multi-stage build (a builder making the wheel into a venv, a runtime
stage copying only that venv), a non-root user, ``dtq`` as the entrypoint, the migrations
packaged in the wheel so ``dtq migrate`` works without a checkout, and a build context that
carries what the Dockerfile copies and never a local ``.env``.
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
PACKAGED_MIGRATIONS = "src/dtq/adapters/cockroach/migrations"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for word, rest in self.instructions if word == keyword]


def instructions() -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` per instruction, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in joined.splitlines():
        text = line.strip()
        if text and not text.startswith("#"):
            word, _, rest = text.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def stages() -> list[Stage]:
    found: list[Stage] = []
    for word, rest in instructions():
        if word == "FROM":
            base, _, name = rest.partition(" AS ")
            found.append(Stage(name=name.strip(), base=base.strip()))
        elif found:
            found[-1].instructions.append((word, rest))
    return found


def test_the_build_has_a_builder_stage_and_a_runtime_stage_on_the_same_base() -> None:
    builder, runtime = stages()

    assert (builder.name, runtime.name) == ("builder", "runtime")
    assert builder.base == runtime.base
    assert any("pip wheel" in run for run in builder.args("RUN"))


def test_the_runtime_stage_takes_only_the_venv_from_the_builder() -> None:
    runtime = stages()[-1]
    from_builder = [copy for copy in runtime.args("COPY") if copy.startswith("--from=")]

    assert from_builder == ["--from=builder /opt/dtq /opt/dtq"]
    assert not any("pip " in run for run in runtime.args("RUN"))


def test_the_runtime_runs_as_a_non_root_user() -> None:
    users = stages()[-1].args("USER")

    assert users, "the runtime stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert any(f"--uid {user}" in run for run in stages()[-1].args("RUN"))


def test_dtq_is_the_entrypoint() -> None:
    assert json.loads(stages()[-1].args("ENTRYPOINT")[-1]) == ["dtq"]


def test_the_wheel_ships_the_migrations_that_dtq_migrate_reads_first() -> None:
    builder = stages()[0]
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["dtq"]

    assert "migrations ./migrations" in builder.args("COPY")
    assert any(f"cp -r migrations {PACKAGED_MIGRATIONS}" in run for run in builder.args("RUN"))
    packaged = PACKAGED_MIGRATIONS.removeprefix("src/dtq/")
    assert f"{packaged}/*.sql" in package_data


# --- .dockerignore --------------------------------------------------------------------------------


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    decision = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if any(_matches(prefix, glob) for prefix in prefixes):
            decision = not negated
    return decision


def _matches(path: str, glob: str) -> bool:
    if glob.startswith("**/"):
        tail = glob.removeprefix("**/")
        return any(
            fnmatch.fnmatchcase("/".join(path.split("/")[i:]), tail)
            for i in range(len(path.split("/")))
        )
    return fnmatch.fnmatchcase(path, glob) and path.count("/") == glob.count("/")


def test_the_build_context_carries_every_path_the_dockerfile_copies() -> None:
    sources = [
        copy.split()[:-1]
        for stage in stages()
        for copy in stage.args("COPY")
        if not copy.startswith("--from=")
    ]
    paths = [path for group in sources for path in group]

    assert {"pyproject.toml", "README.md", "src", "migrations", "examples"} <= set(paths)
    for path in paths:
        assert not ignored(path), path
    for sample in ("src/dtq/worker.py", "migrations/0001_jobs.sql", "examples/topk/app.py"):
        assert not ignored(sample), sample


def test_the_build_context_never_carries_local_configuration_or_caches() -> None:
    for path in (".env", ".git/config", ".venv/bin/python", "artifacts/x", "tests/unit/x.py"):
        assert ignored(path), path
    for path in ("src/dtq/__pycache__/worker.cpython-311.pyc", f"{PACKAGED_MIGRATIONS}/x.sql"):
        assert ignored(path), path
