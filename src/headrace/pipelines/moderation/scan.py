"""The malware scan: ClamAV through clamd when one is configured, and a built-in scanner that
detects the EICAR test file and files on a SHA-256 deny list.

A scan answers clean, or infected with the signature's name (shown to moderators as the reason
the item was quarantined). A scanner that cannot answer (clamd not running, a timeout) raises
`ScanUnavailable`: a transient failure, retried, never taken as clean.

clamd is spoken to over its socket with the INSTREAM command (the file's bytes in chunks, each
after its length as four big-endian bytes, then a zero length): clamd needs no access to the
media directory, and the protocol is the few lines below.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CHUNK = 1 << 16
EICAR_NAME = "Eicar-Test-Signature"
DENIED_NAME = "Headrace.DenyList.SHA256"
# The start of the EICAR test string, in two halves (see samples.EICAR).
_EICAR_MARK = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$" + b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE!"


class ScanUnavailable(Exception):
    """The scanner could not give an answer; the file is neither clean nor infected yet."""


@dataclass(frozen=True)
class Verdict:
    infected: bool
    signature: str = ""  # the name of what was found


CLEAN = Verdict(False)


class Scanner(Protocol):
    name: str

    def scan(self, path: Path) -> Verdict: ...


class BuiltinScanner:
    """Detects the EICAR test file (anywhere in a file, as ClamAV's body signatures do) and
    files whose SHA-256 is on `denied` (hex digests)."""

    name = "builtin"

    def __init__(self, denied: Iterable[str] = ()) -> None:
        self.denied = frozenset(digest.lower() for digest in denied)

    def scan(self, path: Path) -> Verdict:
        digest = hashlib.sha256()
        tail = b""
        found = False
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                found = found or _EICAR_MARK in tail + chunk
                tail = chunk[-len(_EICAR_MARK) :]
        if digest.hexdigest() in self.denied:
            return Verdict(True, DENIED_NAME)
        return Verdict(True, EICAR_NAME) if found else CLEAN


class ClamdScanner:
    """clamd, at a Unix socket path or `host:port`."""

    name = "clamd"

    def __init__(self, address: str, *, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout

    def scan(self, path: Path) -> Verdict:
        try:
            with self._connect() as conn, path.open("rb") as handle:
                conn.sendall(b"zINSTREAM\0")
                while chunk := handle.read(CHUNK):
                    conn.sendall(len(chunk).to_bytes(4, "big") + chunk)
                conn.sendall(b"\0\0\0\0")
                answer = _read_reply(conn)
        except OSError as error:
            raise ScanUnavailable(f"clamd at {self.address}: {error}") from error
        return _verdict(answer, self.address)

    def ping(self) -> bool:
        try:
            with self._connect() as conn:
                conn.sendall(b"zPING\0")
                return _read_reply(conn) == "PONG"
        except OSError:
            return False

    def _connect(self) -> socket.socket:
        if ":" in self.address and not self.address.startswith("/"):
            host, port = self.address.rsplit(":", 1)
            return socket.create_connection((host, int(port)), timeout=self.timeout)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(self.timeout)
        try:
            conn.connect(self.address)
        except OSError:
            conn.close()
            raise
        return conn


def _read_reply(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\0"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.rstrip(b"\0").decode("utf-8", "replace").strip()


def _verdict(answer: str, address: str) -> Verdict:
    # "stream: OK", "stream: <name> FOUND", or "... ERROR" (size limit, a broken stream)
    body = answer.partition(": ")[2] if ": " in answer else answer
    if body == "OK":
        return CLEAN
    if body.endswith(" FOUND"):
        return Verdict(True, body.removesuffix(" FOUND"))
    raise ScanUnavailable(f"clamd at {address} answered {answer[:200]!r}")
