"""What a media store raises.

HeadraceError
├── TooLarge              an upload went past its size limit; nothing of it was kept
├── MissingMedia          an object the caller named is not there (deleted meanwhile)
├── MediaStoreUnusable    a process was given a media store it cannot use (checked at start)
├── ConfigError
│   └── (a bad `--media` value, a storage that ignores conditional writes)
└── TaskFailure
    └── Transient
        └── Unavailable
            └── MediaUnavailable  the storage could not be reached, or refused: retry later,
                                  the attempt not counted (an outage is no item's fault)

A storage library's own errors are translated where they are caught (`s3.py`), with a message
that names the operation and the key, never a credential or a signed URL.
"""

from __future__ import annotations

from headrace.policy.errors import HeadraceError, Unavailable


class TooLarge(HeadraceError):
    """An upload went past its size limit; nothing of it was kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"upload larger than {limit} bytes")
        self.limit = limit


class MissingMedia(HeadraceError):
    """An object the caller named is not in the media store (`key`)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"media store: no object {key}")
        self.key = key


class MediaStoreUnusable(HeadraceError):
    """The media store a process was given cannot be used: it does not answer, ignores
    conditional writes, or holds none of the originals the store's waiting items name. The
    message names the setting, its value and what to do; a command prints it as its one line."""


class MediaUnavailable(Unavailable):
    """The storage could not be reached or refused an operation (`operation` on `key`): a stage
    that meets it runs again later, backing off, its attempt not counted."""

    def __init__(self, operation: str, key: str, reason: str) -> None:
        super().__init__(
            f"media store: {operation} {key} failed: {reason}", code="media.unavailable"
        )
        self.operation = operation
        self.key = key
        self.reason = reason
