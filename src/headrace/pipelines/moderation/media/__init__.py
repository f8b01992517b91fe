"""The media store of the moderation pipeline: its rules (`store.py`), written once over a
narrow `Backend` (`backend.py`) with two implementations, a directory (`directory.py`) and an
S3-compatible bucket (`s3.py`), chosen by `--media` (`urls.py`)."""

from headrace.pipelines.moderation.media.backend import (
    Backend,
    Listed,
    LocalFile,
    Served,
    SignedUrl,
    Streamed,
)
from headrace.pipelines.moderation.media.directory import DirectoryBackend
from headrace.pipelines.moderation.media.errors import (
    MediaStoreUnusable,
    MediaUnavailable,
    MissingMedia,
    TooLarge,
)
from headrace.pipelines.moderation.media.s3 import S3Backend, S3Location
from headrace.pipelines.moderation.media.store import (
    Blob,
    BlobWriter,
    Derived,
    MediaStore,
    StaleBlobs,
    check_media_id,
    check_name,
)
from headrace.pipelines.moderation.media.urls import open_media

__all__ = [
    "Backend",
    "Blob",
    "BlobWriter",
    "Derived",
    "DirectoryBackend",
    "Listed",
    "LocalFile",
    "MediaStore",
    "MediaStoreUnusable",
    "MediaUnavailable",
    "MissingMedia",
    "S3Backend",
    "S3Location",
    "Served",
    "SignedUrl",
    "StaleBlobs",
    "Streamed",
    "TooLarge",
    "check_media_id",
    "check_name",
    "open_media",
]
