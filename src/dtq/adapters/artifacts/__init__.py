"""Artifact storage adapters: a directory (:mod:`.fs`) and an S3-compatible bucket (:mod:`.s3`).

The S3 adapter imports ``obstore`` (the optional ``s3`` extra) only when it is built.
"""

from dtq.adapters.artifacts.fs import FsArtifactStore

__all__ = ["FsArtifactStore"]
