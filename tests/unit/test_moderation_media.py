"""The media store's names and `--media` values: nothing from a client is ever a key, and a bad
value is one error naming the option and what to write. (What every store keeps the same way is
tests/conformance/test_media.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.pipelines.moderation.media import (
    Derived,
    DirectoryBackend,
    S3Backend,
    S3Location,
    open_media,
)
from headrace.pipelines.moderation.media.urls import media_backend, s3_location
from headrace.policy import ConfigError

pytestmark = pytest.mark.anyio

SET = "derived/" + "a" * 32 + "/derive.v1/attempt-" + "0" * 16


@pytest.mark.parametrize("bad", ["../etc/passwd", "photo.jpg", "A" * 32, "", "0" * 31])
async def test_only_a_drawn_media_id_names_a_set(tmp_path: Path, bad: str) -> None:
    media = open_media(tmp_path)
    with pytest.raises(ConfigError, match="media id"):
        await media.derived(bad, "derive", 1)
    with pytest.raises(ConfigError, match="media id"):
        await media.remove_derived(bad)
    assert len(media.new_media_id()) == 32


@pytest.mark.parametrize("name", ["../x", "Preview.webp", "a/b", ".hidden", "manifest.json"])
def test_derivative_names_are_the_stages_own(name: str) -> None:
    with pytest.raises(ConfigError, match="derivative name"):
        Derived(SET, ()).key(name)


async def test_a_set_made_with_a_bad_name_is_not_kept(tmp_path: Path) -> None:
    media = open_media(tmp_path)

    async def make(into: Path) -> None:
        (into / "Preview.WEBP").write_bytes(b"x")

    with pytest.raises(ConfigError, match="derivative name"):
        await media.derive_once(media.new_media_id(), "derive", 1, make)
    assert not (tmp_path / "derived").exists()


async def test_a_manifest_this_store_did_not_write_is_refused(tmp_path: Path) -> None:
    media = open_media(tmp_path)
    media_id = media.new_media_id()
    where = tmp_path / "derived" / media_id / "derive.v1"
    where.mkdir(parents=True)
    (where / "manifest.json").write_text('{"attempt": "../../blobs", "files": []}')
    with pytest.raises(ConfigError, match="manifest"):
        await media.derived(media_id, "derive", 1)


@pytest.mark.parametrize(
    ("given", "root"),
    [("headrace-media", "headrace-media"), ("/srv/m", "/srv/m"), ("file:///srv/m", "/srv/m")],
)
def test_a_path_or_a_file_url_is_a_directory(given: str, root: str) -> None:
    backend = media_backend(given)
    assert isinstance(backend, DirectoryBackend) and backend.root == Path(root)


def test_an_s3_url_names_the_bucket_prefix_and_server() -> None:
    url = "s3://media-bucket/events/2026?endpoint=http://127.0.0.1:9000&region=auto"
    location = s3_location(url, environ={})
    assert location == S3Location(
        "media-bucket", "events/2026", "http://127.0.0.1:9000", "auto", path_style=True
    )
    assert location.describe() == "s3://media-bucket/events/2026 at http://127.0.0.1:9000"
    virtual = s3_location("s3://b12/?path_style=false", environ={})
    assert virtual == S3Location("b12", "", None, None, path_style=False)
    assert isinstance(media_backend(url, environ={}), S3Backend)


def test_the_endpoint_comes_from_the_environment_when_the_url_has_none() -> None:
    env = {"AWS_ENDPOINT_URL": "https://s3.example:8443", "AWS_ENDPOINT_URL_S3": ""}
    assert s3_location("s3://bucket", environ=env).endpoint == "https://s3.example:8443"
    env["AWS_ENDPOINT_URL_S3"] = "http://minio:9000"  # the S3-specific one first
    assert s3_location("s3://bucket", environ=env).endpoint == "http://minio:9000"
    url = "s3://bucket?endpoint=http://other:9000"
    assert s3_location(url, environ=env).endpoint == "http://other:9000"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("s3://Bucket", "bucket of 3 to 63"),
        ("s3://b", "bucket of 3 to 63"),
        ("s3://bucket:9000", "bucket of 3 to 63"),
        ("s3://bucket/a//b", "prefix"),
        ("s3://bucket/../b", "prefix"),
        ("s3://bucket?endpoint=ftp://host", "endpoint: expected http"),
        ("s3://bucket?endpoint=http://host/path", "endpoint: expected http"),
        ("s3://bucket?endpoint=http://host:99999", "port"),
        ("s3://bucket?region=US_EAST", "region"),
        ("s3://bucket?path_style=yes", "path_style: expected true or false"),
        ("s3://bucket?acl=public", "'acl' is none of them"),
        ("s3://bucket?region=a&region=b", "once"),
        ("s3://bucket?region", "NAME=VALUE"),
        ("s3://bucket#x", "no '#'"),
        ("gs://bucket", "a gs:// URL names no media store"),
        ("file://host/srv", "file:///ABSOLUTE/PATH"),
        ("", "expected a directory"),
    ],
)
def test_a_bad_media_value_is_one_line_naming_the_option(given: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        open_media(given, field="--media", environ={})
    message = str(refused.value)
    assert message.startswith("--media: ") and says in message and "\n" not in message


def test_credentials_in_the_url_are_refused_and_never_repeated() -> None:
    with pytest.raises(ConfigError) as refused:
        open_media("s3://AKIAEXAMPLE:s3cr3t@bucket/media", field="--media", environ={})
    message = str(refused.value)
    assert "AWS_ACCESS_KEY_ID" in message
    assert "s3cr3t" not in message and "AKIAEXAMPLE" not in message
