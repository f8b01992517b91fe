"""The S3-compatible server the suite uses (LocalStack's S3, started by .ci/run with
.ci/s3-server on HEADRACE_TEST_S3), and a bucket of its own for each test. It checks the
signature and the expiry of presigned URLs, so a test sees a wrong one refused."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import httpx

from tests.services import unavailable

ENDPOINT = os.environ.get("HEADRACE_TEST_S3", "http://127.0.0.1:9010")
REGION = "us-east-1"
# The test server (LocalStack's S3, .ci/s3-server) takes any key id, and checks a presigned
# URL's signature against the secret `test` for a key nobody registered with it; a real server
# is given its own key in the environment.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "headrace-test"),
    "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
}


def reachable() -> str:
    """The test server's endpoint; skip when it does not answer (fail when `CI` is set)."""
    try:
        httpx.get(ENDPOINT, timeout=3)
    except httpx.HTTPError as error:
        reason = f"no S3-compatible server answers at {ENDPOINT}: {error}".strip()
        unavailable(reason, "S3 tests")
    return ENDPOINT


def admin() -> Any:
    """A boto3 client of the test server, to make and drop buckets."""
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


@contextmanager
def fresh_bucket() -> Iterator[str]:
    """A bucket no one else uses, emptied and removed afterwards."""
    reachable()
    client = admin()
    bucket = f"headrace-test-{uuid.uuid4().hex[:16]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield bucket
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            keys = [{"Key": found["Key"]} for found in page.get("Contents", ())]
            if keys:
                client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
        client.delete_bucket(Bucket=bucket)


def keys_in(bucket: str) -> list[str]:
    """Every key in `bucket`, as the server lists them."""
    pages = admin().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(found["Key"] for page in pages for found in page.get("Contents", ()))


def media_url(bucket: str, prefix: str = "media") -> str:
    return f"s3://{bucket}/{prefix}?endpoint={ENDPOINT}&region={REGION}"
