"""ClamAV's clamd, for real: started on a signature database of our own that holds the EICAR test
signature (nothing is downloaded), spoken to over its socket. Skips where clamd is not
installed, and fails instead when CI is set (.ci/run installs clamav-daemon)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.scan import ClamdScanner, ScanUnavailable
from tests.services import unavailable

pytestmark = pytest.mark.realtime

START_TIMEOUT = 60.0


def eicar_signatures(directory: Path) -> None:
    """A body signature for the EICAR string wherever it sits in a file."""
    directory.mkdir(parents=True, exist_ok=True)
    body = samples.eicar()[:64].hex()
    (directory / "headrace-test.ndb").write_text(f"Headrace.Test.EICAR:0:*:{body}\n")


@pytest.fixture(scope="module")
def clamd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClamdScanner]:
    binary = shutil.which("clamd") or (
        "/usr/sbin/clamd" if Path("/usr/sbin/clamd").exists() else None
    )
    if binary is None:
        unavailable("clamd is not installed (apt-get install clamav-daemon)", "the clamd tests")
    home = tmp_path_factory.mktemp("clamd")
    eicar_signatures(home / "db")
    socket_path = home / "clamd.sock"
    config = home / "clamd.conf"
    config.write_text(
        f"LocalSocket {socket_path}\nDatabaseDirectory {home / 'db'}\nForeground yes\n"
        f"TemporaryDirectory {home}\nLogFile {home / 'clamd.log'}\n"
    )
    process = subprocess.Popen(
        [binary, "-c", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    scanner = ClamdScanner(str(socket_path), timeout=10.0)
    deadline = time.monotonic() + START_TIMEOUT
    while not scanner.ping():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            log = (home / "clamd.log").read_text() if (home / "clamd.log").exists() else ""
            pytest.fail(f"clamd did not start: {log[-2000:]}")
        time.sleep(0.1)
    yield scanner
    process.terminate()
    process.wait(timeout=10)


def test_clamd_finds_eicar_alone_and_inside_a_photo(clamd: ClamdScanner, tmp_path: Path) -> None:
    alone = tmp_path / "a"
    alone.write_bytes(samples.eicar())
    inside = tmp_path / "b"
    inside.write_bytes(samples.jpeg() + samples.eicar())
    for path in (alone, inside):
        verdict = clamd.scan(path)
        assert verdict.infected
        assert verdict.signature.startswith("Headrace.Test.EICAR")


def test_clamd_passes_clean_media(clamd: ClamdScanner, media_samples: dict[str, Path]) -> None:
    for name in ("photo.jpg", "clip.mp4", "song.mp3"):
        assert not clamd.scan(media_samples[name]).infected


def test_a_clamd_that_is_not_there_is_unavailable_not_clean(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(samples.jpeg())
    scanner = ClamdScanner(str(tmp_path / "no.sock"), timeout=1.0)
    assert not scanner.ping()
    with pytest.raises(ScanUnavailable):
        scanner.scan(path)
