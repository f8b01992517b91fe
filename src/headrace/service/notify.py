"""The outbox relay: notifications written with the changes that owe them (a moderator's
decision: `item.approved`, `item.rejected`) are sent to a URL, each until it is acknowledged.

Each notification is a POST of a JSON object (`id`, `topic`, `kind`, `record_id`, `scope`,
`at`, `body`) signed as headrace's own webhooks are checked: `Webhook-Id: <id>` and
`Webhook-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`. A 2xx answer marks
it delivered; anything else, or no answer, and it is sent again after a pause that doubles up
to a minute. Delivery is at least once (a relay that dies between the answer and the mark
sends it again, and two serving processes may both send one): a receiver drops an `id` it has
seen.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx

from headrace.policy.errors import ConfigError, StoreUnavailable
from headrace.policy.redact import hide_passwords
from headrace.service.api.webhooks import sign
from headrace.store.protocol.records import OutboxRow
from headrace.store.protocol.tasks import Store

log = logging.getLogger("headrace.notify")

BATCH = 100
MAX_PAUSE = 60.0


class OutboxRelay:
    def __init__(
        self,
        url: str,
        secret: str,
        *,
        every: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError("notify url: expected an http:// or https:// URL")
        if len(secret) < 16:
            raise ConfigError("notify secret: expected 16 characters or more")
        self.url = url
        self.secret = secret
        self.every = every
        self.transport = transport
        self.sent = 0
        self.failures = 0

    async def run(self, store: Store) -> None:
        """Send what the outbox holds, then what it is given, until cancelled."""
        pause = self.every
        async with httpx.AsyncClient(timeout=10, transport=self.transport) as client:
            while True:
                try:
                    stuck = await self.relay_once(store, client)
                except StoreUnavailable as error:
                    log.warning("outbox not read (%s); trying again", error)
                    stuck = True
                pause = min(pause * 2, MAX_PAUSE) if stuck else self.every
                await asyncio.sleep(pause)

    async def relay_once(self, store: Store, client: httpx.AsyncClient) -> bool:
        """Send every pending notification once, in order; whether one was not acknowledged
        (the rest wait behind it, so a receiver sees them in the order written)."""
        while True:
            pending = await store.records.outbox(pending=True, limit=BATCH)
            for notice in pending:
                if not await self.send(client, notice):
                    return True
                await store.records.mark_delivered([notice.id])
                self.sent += 1
            if len(pending) < BATCH:
                return False

    async def send(self, client: httpx.AsyncClient, notice: OutboxRow) -> bool:
        raw = json.dumps(
            {
                "id": notice.id,
                "topic": notice.topic,
                "kind": notice.kind,
                "record_id": notice.record_id,
                "scope": notice.scope,
                "at": notice.at,
                "body": dict(notice.body),
            },
            sort_keys=True,
        ).encode()
        headers = {
            "Content-Type": "application/json",
            "Webhook-Id": str(notice.id),
            "Webhook-Signature": sign(self.secret, raw, int(time.time())),
        }
        try:
            answer = await client.post(self.url, content=raw, headers=headers)
        except httpx.HTTPError as error:
            return self._failed(notice, type(error).__name__)
        if 200 <= answer.status_code < 300:
            return True
        return self._failed(notice, f"HTTP {answer.status_code}")

    def _failed(self, notice: OutboxRow, why: str) -> bool:
        self.failures += 1
        log.warning(
            "notification %d (%s) not delivered to %s: %s; sending it again later",
            notice.id,
            notice.topic,
            hide_passwords(self.url.split("?", 1)[0]),
            why,
        )
        return False
