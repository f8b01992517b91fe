"""The built-in scanner: the EICAR test file wherever it sits in a file, and a SHA-256 deny
list. (clamd itself: tests/integration/test_clamd.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

from headrace.pipelines.moderation import samples
from headrace.pipelines.moderation.scan import DENIED_NAME, EICAR_NAME, BuiltinScanner


def test_eicar_is_found_alone_and_inside_a_photo(tmp_path: Path) -> None:
    scanner = BuiltinScanner()
    alone = tmp_path / "a"
    alone.write_bytes(samples.eicar())
    inside = tmp_path / "b"
    inside.write_bytes(samples.jpeg() + samples.eicar())  # decoders stop at the JPEG's end
    for path in (alone, inside):
        verdict = scanner.scan(path)
        assert verdict.infected and verdict.signature == EICAR_NAME


def test_eicar_across_a_read_boundary_is_found(tmp_path: Path) -> None:
    path = tmp_path / "c"
    path.write_bytes(b"\0" * (65536 - 20) + samples.eicar())  # split between two chunks
    assert BuiltinScanner().scan(path).infected


def test_a_denied_digest_is_infected_and_a_clean_file_is_clean(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.write_bytes(samples.png())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert not BuiltinScanner().scan(path).infected
    verdict = BuiltinScanner(denied=[digest.upper()]).scan(path)
    assert verdict.infected and verdict.signature == DENIED_NAME
