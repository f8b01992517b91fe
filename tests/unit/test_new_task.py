"""NewTask refuses bad fields by name, before any store sees them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.policy.errors import ConfigError
from headrace.store.protocol.types import MAX_DELAY, NewTask, Sibling


def task(**fields: Any) -> NewTask:
    return NewTask(**{"kind": "render", "ref": "ep6-s01", **fields})


@pytest.mark.parametrize("group", ["", 0, 6, b"ep6", ["ep6"], ("ep6",), 1.5, True])
def test_an_empty_or_non_string_group_is_refused(group: object) -> None:
    with pytest.raises(ConfigError, match=r"^task\.group: expected a non-empty string or None"):
        task(group=group)


def test_a_group_may_be_a_name_or_none() -> None:
    assert task(group="ep6").group == "ep6"
    assert task(group=None).group is None


@pytest.mark.parametrize(
    "delay", [1e300, MAX_DELAY * 2, math.nextafter(MAX_DELAY, math.inf), 10**20]
)
def test_a_delay_past_the_bound_is_refused(delay: float) -> None:
    with pytest.raises(ConfigError, match=r"^task\.delay: at most 31622400 seconds"):
        task(delay=delay)


@given(st.floats(0.0, MAX_DELAY))
@settings(max_examples=200, deadline=None)
def test_every_delay_up_to_the_bound_is_kept(delay: float) -> None:
    assert task(delay=delay).delay == delay


@given(st.floats(allow_nan=True) | st.integers(-(10**30), 10**30))
@settings(max_examples=300, deadline=None)
def test_any_other_delay_is_refused_by_name(delay: float) -> None:
    if 0 <= delay <= MAX_DELAY:
        return
    with pytest.raises(ConfigError, match=r"^task\.delay: "):
        task(delay=delay)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_attempts", 2.5),
        ("max_attempts", "3"),
        ("max_attempts", 0),
        ("max_attempts", True),
        ("weight", 0),
        ("weight", -1.0),
        ("weight", "2"),
        ("weight", math.inf),
        ("cost", 10**400),
        ("delay", 10**400),
        ("gates", "provider:video"),
        ("gates", ("provider:video", "")),
        ("gates", ("provider:video", 7)),
        ("after", (0,)),
        ("after", (True,)),
        ("after", ("12",)),
        ("after", (Sibling(-1),)),
        ("after", [1]),
        ("flow", ""),
        ("kind", None),
        ("key", ""),
    ],
)
def test_other_bad_fields_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^task\.{field}: "):
        task(**{field: value})


@pytest.mark.parametrize(
    "ref",
    [
        "https://b.s3.amazonaws.com/ev42/clip.mp4?X-Amz-Algorithm=AWS4&X-Amz-Signature=S3CR3T",
        "https://storage.googleapis.com/b/clip.mp4?X-Goog-Signature=S3CR3T",
        "https://d1.cloudfront.net/clip.mp4?Expires=1700000000&Signature=S3CR3T&Key-Pair-Id=K",
        "https://acct.blob.core.windows.net/c/clip.mp4?sv=2022-11-02&sig=S3CR3T",
        "clip.mp4?token=S3CR3T",
        "clip.mp4?access_token=S3CR3T",
        "clip.mp4?api_key=S3CR3T",
        "clip.mp4%3FX-Amz-Signature%3DS3CR3T",
        "clip.mp4%253Fsig%253DS3CR3T",
        "CLIP.MP4?SIGNATURE=S3CR3T",
        "Bearer S3CR3T",
        "https://uploader:S3CR3T@media.example.com/ev42/clip.mp4",
    ],
)
def test_a_ref_that_carries_a_credential_is_refused_without_echoing_it(ref: str) -> None:
    with pytest.raises(ConfigError, match=r"^task\.ref: carries a credential") as refused:
        task(ref=ref)
    assert "S3CR3T" not in str(refused.value)
    assert "stable record id" in str(refused.value)


@pytest.mark.parametrize(
    "ref", ["ep6-s01", "uploads/ev42/8f14e45f.mp4", "https://cdn.example.com/v/ep6.mp4?v=2"]
)
def test_a_record_id_is_a_ref(ref: str) -> None:
    assert task(ref=ref).ref == ref
