"""Pillow's test images uploaded through `headrace serve`: what became of each file.

`python -m bench.corpus [--corpus DIR] [--store sqlite|postgresql] [--media DIR_OR_URL]
[--only NAME ...] [--at-once 4] [--out JSON]`

The corpus is the `Tests/images` directory of Pillow 13.0.0's source distribution on PyPI: 1,060
odd, corrupt and fuzzer-found files in some forty formats. `.ci/corpus` downloads and extracts it
once (PyPI only) and prints where; `--corpus` or `HEADRACE_PILLOW_CORPUS` names it here.

A real `headrace serve` is started on the store chosen (a scratch SQLite file, or a schema of its
own on `HEADRACE_TEST_PG`'s PostgreSQL, dropped afterwards) and the media store given (a scratch
directory unless `--media` names a directory or an `s3://` URL), its workers in its process.
Every file is uploaded as a guest of its own would send it, `--at-once` at a time, each under an
Idempotency-Key of its own; a `429` is sent again after its `Retry-After`, as a client does. Once
every upload has settled (reviewable or refused: none waits or is processed), it prints the
uploads by final state and reason, the answers by status and how many were 5xx, the originals
in the media store that no item names, and the dead tasks, and exits 1 if any of those four is
not what it must be (no 5xx, all settled, no original without its item, no dead task).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

import headrace as hr
from bench.serving import Server, serving, tokens
from headrace.pipelines.moderation.media import open_media
from headrace.pipelines.moderation.pipeline import ItemState, Records

ROOT = Path(__file__).parents[1]
CORPUS = "HEADRACE_PILLOW_CORPUS"
POSTGRES = os.environ.get("HEADRACE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
EVENT = "corpus"
SETTLED = {state.value for state in ItemState if state.settled and state is not ItemState.DECLINED}
SETTLE_TIMEOUT = 1800.0
UPLOAD_TIMEOUT = 120.0
RETRIES = 50  # times a 429 is sent again before the upload counts as not taken


@dataclass
class Upload:
    """One file's upload: every answer's status, and its item's final state and reason."""

    name: str
    statuses: list[int] = field(default_factory=list)
    media_id: str | None = None
    state: str | None = None
    reason: str | None = None
    media_type: str | None = None


@dataclass
class CorpusRun:
    """What became of a corpus's uploads, and what the stores held after."""

    uploads: list[Upload]
    seconds: float
    unnamed_originals: list[str] = field(default_factory=list)
    dead_tasks: int = 0

    @property
    def server_errors(self) -> int:
        return sum(status >= 500 for upload in self.uploads for status in upload.statuses)

    @property
    def unsettled(self) -> list[Upload]:
        return [upload for upload in self.uploads if upload.state not in SETTLED]

    @property
    def ok(self) -> bool:
        bad = self.server_errors or self.unsettled or self.unnamed_originals or self.dead_tasks
        return not bad

    def states(self) -> Counter[str]:
        return Counter(upload.state or "not taken" for upload in self.uploads)

    def reasons(self) -> Counter[str]:
        return Counter(upload.reason for upload in self.uploads if upload.reason)

    def statuses(self) -> Counter[int]:
        return Counter(status for upload in self.uploads for status in upload.statuses)


def corpus_files(root: Path, only: Sequence[str] = ()) -> list[Path]:
    """The corpus's files (those named in `only`, paths under `root`, when given), in order."""
    if only:
        return [root / name for name in only]
    return sorted(path for path in root.rglob("*") if path.is_file())


# -- a server


@contextlib.contextmanager
def corpus_server(db: str, media: str) -> Iterator[Server]:
    """`headrace serve` on `db` and `media`, with a token for each role."""
    made = tokens(db, {role: (role, EVENT) for role in ("contributor", "moderator")})
    made |= tokens(db, {"admin": ("admin", "*")})
    with serving(db, media, made) as server:
        yield server


@contextlib.contextmanager
def scratch_store(kind: str, scratch: Path) -> Iterator[str]:
    """A store URL no one else uses: an SQLite file in `scratch`, or a PostgreSQL schema of
    its own, dropped afterwards."""
    if kind == "sqlite":
        yield f"sqlite:///{scratch / 'corpus.db'}"
        return
    import psycopg
    from psycopg import sql

    schema = f"corpus_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}schema={schema}"
    finally:
        with psycopg.connect(POSTGRES, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# -- the uploads


async def send(client: httpx.AsyncClient, server: Server, path: Path, key: str) -> Upload:
    """Upload one file as a guest of its own (no session cookie kept), sent again on 429."""
    upload = Upload(path.name)
    headers = {**server.auth("contributor"), "Idempotency-Key": key}
    data = await asyncio.to_thread(path.read_bytes)
    for _ in range(RETRIES):
        answer = await client.post(
            f"{server.url}/v1/events/{EVENT}/uploads",
            headers=headers,
            files={"file": ("upload", data)},
        )
        client.cookies.clear()
        upload.statuses.append(answer.status_code)
        if answer.status_code == 202:
            upload.media_id = answer.json()["media_id"]
            return upload
        if answer.status_code != 429:
            return upload
        await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
    return upload


async def items(client: httpx.AsyncClient, server: Server) -> dict[str, dict[str, str | None]]:
    """Every item of the event, as moderators see it, by media id."""
    found: dict[str, dict[str, str | None]] = {}
    after = 0
    while True:
        answer = await client.get(
            f"{server.url}/v1/events/{EVENT}/items",
            params={"after": after, "limit": 500},
            headers=server.auth("moderator"),
        )
        page = answer.json()
        found.update({item["media_id"]: item for item in page["items"]})
        if not page["newer"]:
            return found
        after = page["next"]


async def upload_all(
    server: Server, files: Sequence[Path], *, at_once: int = 4, root: Path | None = None
) -> CorpusRun:
    """Upload `files` through `server`, `at_once` at a time, and wait until each settled."""
    started = time.monotonic()
    gate = asyncio.Semaphore(at_once)
    async with httpx.AsyncClient(timeout=UPLOAD_TIMEOUT) as client:

        async def one(index: int, path: Path) -> Upload:
            async with gate:
                upload = await send(client, server, path, f"corpus-{index}")
            upload.name = str(path.relative_to(root)) if root is not None else path.name
            return upload

        uploads = list(await asyncio.gather(*(one(n, p) for n, p in enumerate(files))))
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            found = await items(client, server)
            for upload in uploads:
                if upload.media_id in found:
                    item = found[upload.media_id]
                    upload.state, upload.reason = item["state"], item["reason"]
                    upload.media_type = item["media_type"]
            if (
                all(u.state in SETTLED for u in uploads if u.media_id)
                or time.monotonic() > deadline
            ):
                break
            await asyncio.sleep(0.5)
        letters = await client.get(
            f"{server.url}/v1/dead-letters", params={"limit": 1000}, headers=server.auth("admin")
        )
    return CorpusRun(uploads, time.monotonic() - started, dead_tasks=len(letters.json()))


async def unnamed_originals(db: str, media: str) -> list[str]:
    """The originals in the media store that no item still needing one names (a refused item
    needs none): an upload must never leave one behind."""
    app = hr.App(db)
    async with app:
        needed = {
            item.digest for item in await Records(app).all() if item.state is not ItemState.REFUSED
        }
    keys = await open_media(media).backend.keys("blobs")
    return sorted(key for key in keys if key.rsplit("/", 1)[-1] not in needed)


# -- the command


def report(run: CorpusRun, *, store: str, media: str) -> str:
    states = ", ".join(f"{state} {n}" for state, n in run.states().most_common())
    reasons = ", ".join(f"{reason} {n}" for reason, n in run.reasons().most_common())
    statuses = ", ".join(f"{status} {n}" for status, n in sorted(run.statuses().items()))
    return "\n".join(
        (
            f"{len(run.uploads)} files through headrace serve (store {store}, media {media}) "
            f"in {run.seconds:.0f} s",
            f"answers: {statuses}; 5xx: {run.server_errors}",
            f"final states: {states}",
            f"reasons: {reasons or 'none'}",
            f"not settled: {len(run.unsettled)}; originals no item names: "
            f"{len(run.unnamed_originals)}; dead tasks: {run.dead_tasks}",
        )
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__)
    parser.add_argument("--corpus", type=Path, default=os.environ.get(CORPUS))
    parser.add_argument("--store", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--media", help="a directory or an s3:// URL (a scratch directory)")
    parser.add_argument("--only", nargs="*", default=(), help="files under the corpus")
    parser.add_argument("--at-once", type=int, default=4)
    parser.add_argument("--out", type=Path, help="each file's answers and outcome, as JSON")
    args = parser.parse_args(argv)
    if args.corpus is None or not Path(args.corpus).is_dir():
        raise SystemExit(
            f"no corpus: give --corpus DIR or {CORPUS} (bash .ci/corpus fetches it and prints it)"
        )
    files = corpus_files(Path(args.corpus), args.only)
    with (
        tempfile.TemporaryDirectory(prefix="headrace-corpus.") as scratch,
        scratch_store(args.store, Path(scratch)) as db,
    ):
        media = args.media or str(Path(scratch) / "media")
        with corpus_server(db, media) as server:
            run = asyncio.run(upload_all(server, files, at_once=args.at_once, root=args.corpus))
        run.unnamed_originals = asyncio.run(unnamed_originals(db, media))
    print(report(run, store=args.store, media="directory" if args.media is None else media))
    if args.out is not None:
        args.out.write_text(json.dumps([asdict(upload) for upload in run.uploads], indent=1))
    if not run.ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
