"""Store URLs as a log line or an error message may print them: never with a password."""

from __future__ import annotations

import pytest

from headrace.policy.redact import hide_passwords


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://studio:s3cret@db:5432/media", "postgresql://studio:***@db:5432/media"),
        ("postgres://:pw@db/media?schema=x", "postgres://:***@db/media?schema=x"),
        ("postgresql://u:p@ss:w:rd@db/m", "postgresql://u:***@db/m"),
        ("postgresql://u@db/m?password=x&schema=s", "postgresql://u@db/m?password=***&schema=s"),
        ("postgresql://studio@db:5432/media", "postgresql://studio@db:5432/media"),
        ("sqlite:////srv/studio.db", "sqlite:////srv/studio.db"),
        (
            "cannot reach postgresql://a:b@h/d, nor postgresql://c:d@h/e",
            "cannot reach postgresql://a:***@h/d, nor postgresql://c:***@h/e",
        ),
    ],
)
def test_passwords_are_hidden_wherever_a_url_appears(text: str, shown: str) -> None:
    assert hide_passwords(text) == shown
