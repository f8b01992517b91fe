"""Where a deployment keeps its media (`--media`, `HEADRACE_MEDIA`): a path or a URL.

| value | store |
| --- | --- |
| `DIR`, `/srv/media`, `file:///srv/media` | a directory every process shares |
| `s3://BUCKET[/PREFIX][?OPTIONS]` | an S3-compatible bucket (AWS S3, MinIO, R2, Ceph RGW) |

Options of an `s3://` URL, each at most once: `endpoint=http(s)://HOST[:PORT]` (the server; by
default `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, else AWS S3), `region=NAME` (by default
`AWS_REGION` or `AWS_DEFAULT_REGION`, else `us-east-1`), `path_style=true|false` (addressing:
`http://HOST/BUCKET/KEY`, the default, which every S3-compatible server takes, or
`http://BUCKET.HOST/KEY`). Credentials never go in the URL: the environment has them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from headrace.pipelines.moderation.media.backend import Backend
from headrace.pipelines.moderation.media.directory import DirectoryBackend
from headrace.pipelines.moderation.media.s3 import S3Backend, S3Location
from headrace.pipelines.moderation.media.store import MediaStore
from headrace.policy.errors import ConfigError

S3_FORM = "s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=NAME&path_style=true|false"
S3_OPTIONS = ("endpoint", "region", "path_style")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()=+,;@-]+")
_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def open_media(
    where: str | Path, *, field: str = "media", environ: Mapping[str, str] | None = None
) -> MediaStore:
    """The media store `where` names; ConfigError naming `field` and what to write."""
    return MediaStore(media_backend(where, field=field, environ=environ), setting=field)


def media_backend(
    where: str | Path, *, field: str = "media", environ: Mapping[str, str] | None = None
) -> Backend:
    if isinstance(where, Path):
        return DirectoryBackend(where)
    if not where.strip():
        raise ConfigError(f"{field}: expected a directory, file:///PATH or {S3_FORM}")
    scheme = urlsplit(where).scheme.lower() if "://" in where else ""
    if scheme == "":
        return DirectoryBackend(Path(where))
    if scheme == "file":
        return DirectoryBackend(_file_path(where, field))
    if scheme == "s3":
        return S3Backend(s3_location(where, field=field, environ=environ))
    raise ConfigError(
        f"{field}: a {scheme}:// URL names no media store; expected a directory, "
        f"file:///PATH or {S3_FORM}"
    )


def s3_location(
    url: str, *, field: str = "media", environ: Mapping[str, str] | None = None
) -> S3Location:
    """What an `s3://` URL names; ConfigError naming `field` and what to write."""
    parts = urlsplit(url)
    if "@" in parts.netloc:  # the value is not repeated: it holds a secret
        raise ConfigError(
            f"{field}: put no credentials in the URL; set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) in the environment"
        )
    if not _BUCKET.fullmatch(parts.netloc) or ".." in parts.netloc:
        raise ConfigError(
            f"{field}: expected {S3_FORM}, with a bucket of 3 to 63 lower-case letters, digits, "
            f"'.' or '-'; got bucket {parts.netloc!r}"
        )
    if parts.fragment:
        raise ConfigError(f"{field}: expected {S3_FORM}, with no '#'")
    options = _options(parts, field)
    env = os.environ if environ is None else environ
    endpoint = options.get("endpoint") or next(
        (env[name] for name in ENDPOINT_VARIABLES if env.get(name)), None
    )
    return S3Location(
        bucket=parts.netloc,
        prefix=_prefix(parts.path, field),
        endpoint=None if endpoint is None else _endpoint(endpoint, field),
        region=_region(options.get("region"), field),
        path_style=_path_style(options.get("path_style", "true"), field),
    )


def _file_path(url: str, field: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost") or not parts.path or parts.query or parts.fragment:
        raise ConfigError(f"{field}: expected file:///ABSOLUTE/PATH (a directory on this host)")
    return Path(unquote(parts.path))


def _options(parts: SplitResult, field: str) -> dict[str, str]:
    try:
        given = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ConfigError(
            f"{field}: expected {S3_FORM}; the part after '?' is not NAME=VALUE&…"
        ) from None
    for name, values in given.items():
        if name not in S3_OPTIONS:
            raise ConfigError(
                f"{field}: an s3:// URL takes the options {', '.join(S3_OPTIONS)}; "
                f"{name!r} is none of them"
            )
        if len(values) > 1:
            raise ConfigError(f"{field}: give the option {name} once")
    return {name: values[0] for name, values in given.items()}


def _prefix(path: str, field: str) -> str:
    prefix = path.strip("/")
    for part in prefix.split("/") if prefix else ():
        if part in (".", "..") or not _PREFIX_PART.fullmatch(part):
            raise ConfigError(
                f"{field}: expected {S3_FORM}, with a prefix of letters, digits and "
                "!_.*'()=+,;@- between single '/'"
            )
    return prefix


def _endpoint(endpoint: str, field: str) -> str:
    parts = urlsplit(endpoint)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.path.strip("/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(f"{field}: endpoint: expected http://HOST:PORT or https://HOST[:PORT]")
    try:
        parts.port  # noqa: B018 (reading it checks it)
    except ValueError:
        raise ConfigError(f"{field}: endpoint: the port is not a number from 0 to 65535") from None
    return f"{parts.scheme}://{parts.netloc}"


def _region(region: str | None, field: str) -> str | None:
    if region is not None and not _REGION.fullmatch(region):
        raise ConfigError(f"{field}: region: expected a name such as us-east-1 or auto")
    return region


def _path_style(value: str, field: str) -> bool:
    if value not in ("true", "false"):
        raise ConfigError(f"{field}: path_style: expected true or false")
    return value == "true"
