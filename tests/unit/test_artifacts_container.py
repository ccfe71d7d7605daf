"""The container builds the artifact store ``ARTIFACT_BACKEND`` names."""

from __future__ import annotations

from pathlib import Path

from dtq.adapters.artifacts.fs import FsArtifactStore
from dtq.adapters.artifacts.s3 import S3ArtifactStore
from dtq.entrypoints.config import load_settings
from dtq.entrypoints.container import build_container


def test_fs_backend_uses_artifact_dir(tmp_path: Path) -> None:
    settings = load_settings({"ARTIFACT_DIR": str(tmp_path)})
    store = build_container(settings, backend="memory").artifact_store()
    assert isinstance(store, FsArtifactStore)
    assert store.root == tmp_path


def test_fs_backend_defaults_to_artifacts_in_the_working_directory() -> None:
    store = build_container(load_settings({}), backend="memory").artifact_store()
    assert isinstance(store, FsArtifactStore)
    assert store.root == Path("artifacts")


def test_s3_backend_builds_the_s3_store() -> None:
    settings = load_settings(
        {"ARTIFACT_BACKEND": "s3", "ARTIFACT_S3_BUCKET": "b", "ARTIFACT_S3_ENDPOINT": "http://h:1"}
    )
    assert isinstance(build_container(settings, backend="memory").artifact_store(), S3ArtifactStore)


def test_dtq_dev_puts_artifacts_in_a_new_temporary_directory(capsys) -> None:
    from dtq.entrypoints.cli.dev import dev_artifact_dir

    settings = dev_artifact_dir(load_settings({}))
    assert settings.artifact_dir is not None
    assert settings.artifact_dir.is_dir()
    assert str(settings.artifact_dir) in capsys.readouterr().out
    settings.artifact_dir.rmdir()
    chosen = load_settings({"ARTIFACT_DIR": "/srv/a"})
    assert dev_artifact_dir(chosen) is chosen


def test_dtq_dev_removes_its_temporary_directory_only_when_no_artifact_was_written(
    tmp_path, capsys
) -> None:
    from dtq.entrypoints.cli.dev import dev_artifact_dir, drop_empty_artifact_dir

    unset = load_settings({})
    empty = dev_artifact_dir(unset)
    drop_empty_artifact_dir(unset, empty)
    assert empty.artifact_dir is not None and not empty.artifact_dir.exists()

    kept = dev_artifact_dir(unset)
    assert kept.artifact_dir is not None
    (kept.artifact_dir / "report.csv").write_text("a,b\n")
    drop_empty_artifact_dir(unset, kept)
    assert (kept.artifact_dir / "report.csv").exists()  # left for inspection
    (kept.artifact_dir / "report.csv").unlink()
    kept.artifact_dir.rmdir()

    mine = load_settings({"ARTIFACT_DIR": str(tmp_path)})
    drop_empty_artifact_dir(mine, dev_artifact_dir(mine))
    assert tmp_path.is_dir()  # the user's own directory is never removed
