"""`Retention`: its defaults, the `NAME=AGE` words it reads, and the errors naming a field."""

from __future__ import annotations

import pytest

from headrace.policy import ConfigError
from headrace.policy.durations import seconds, spoken
from headrace.policy.retention import DAY, SIGN_IN_LIFETIME, Retention, shown
from headrace.runtime import remote
from headrace.service.api import auth, webhooks
from headrace.store.protocol import pruning


def test_the_defaults_keep_a_day_of_history_and_a_month_of_dead_letters() -> None:
    kept = Retention()
    assert (kept.succeeded, kept.cancelled, kept.dead) == (DAY, DAY, 30 * DAY)
    assert (kept.delivered, kept.audit, kept.deliveries) == (DAY, 365 * DAY, 7 * DAY)
    assert (kept.sign_ins, kept.turned_away, kept.closed_events) == (DAY, 7 * DAY, 30 * DAY)
    assert (kept.upload_grace, kept.every, kept.batch) == (120.0, 300.0, 500)
    assert dict(kept.described())["dead"] == "30d"
    assert dict(kept.described())["every"] == "5m"


def test_words_change_the_settings_they_name() -> None:
    kept = Retention.parse(["dead=14d", "succeeded = 6h", "sign-ins=2d", "every=off", "batch=1000"])
    assert (kept.dead, kept.succeeded, kept.sign_ins) == (14 * DAY, 6 * 3600.0, 2 * DAY)
    assert kept.every is None and kept.batch == 1000
    assert kept.cancelled == DAY  # the rest as they were
    assert Retention.parse(["audit=never"]).audit is None
    assert Retention.parse(["closed_events=90d"], base=kept).closed_events == 90 * DAY
    assert Retention.parse(["closed_events=90d"], base=kept).dead == 14 * DAY


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (["dead=soon"], "retention.dead"),
        (["dead"], "NAME=AGE"),
        (["forever=1d"], "succeeded, cancelled, dead"),
        (["sign_ins=1h"], "retention.sign_ins: expected at least 12h, got 1h"),
        (["deliveries=2h"], "retention.deliveries: expected at least 1d"),
        (["batch=0"], "retention.batch"),
        (["batch=lots"], "retention.batch"),
        (["upload_grace=off"], "retention.upload_grace"),
        (["upload_grace=0s"], "retention.upload_grace"),
        (["every=0"], "retention.every"),
    ],
)
def test_a_bad_word_is_refused_naming_the_setting(words: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Retention.parse(words)


@pytest.mark.parametrize(
    ("field", "value"),
    [("dead", -1.0), ("audit", float("inf")), ("succeeded", "1d"), ("batch", True)],
)
def test_a_bad_value_in_code_is_refused_naming_the_setting(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"retention.{field}"):
        Retention(**{field: value})  # type: ignore[arg-type]


def test_the_sweep_looks_back_no_further_than_a_failed_validation_is_kept() -> None:
    assert Retention().sweep_horizon == DAY
    assert Retention(cancelled=None).sweep_horizon == 30 * DAY
    assert Retention(cancelled=None, dead=None).sweep_horizon is None


def test_durations_read_and_say_days() -> None:
    assert seconds("7d") == 7 * DAY
    assert [spoken(v) for v in (DAY, 12 * 3600.0, 5400.0, 90.0, 0.25, 1.5)] == [
        "1d",
        "12h",
        "90m",
        "90s",
        "250ms",
        "1.5s",
    ]
    assert [shown(v) for v in (None, 500, 300.0)] == ["off", "500", "5m"]


def test_the_names_retention_uses_are_those_the_writers_use() -> None:
    assert SIGN_IN_LIFETIME == auth.LOGIN_TTL
    assert (pruning.LOGIN, pruning.DELIVERY, pruning.REMOTE) == (
        auth.LOGIN,
        webhooks.DELIVERY,
        remote.REMOTE,
    )
