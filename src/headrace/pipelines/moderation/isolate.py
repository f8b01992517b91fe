"""Decoding where a hostile file cannot take the worker down: each decode runs in a child
process of its own, with an address-space limit and a wall-clock timeout.

A child is forked from a forkserver that has the media modules (PyAV, libvips, Pillow) loaded
already, so it starts in milliseconds, not an interpreter start per item, and shares none of the
worker's memory. It first reads the file's headers under a small limit (`HEADER_MEMORY`), which
gives the estimate of what decoding will cost (`Probed.memory`); past the most a child may use
it stops there. Otherwise it lowers its limit to what it measures it has mapped, plus twice the
estimate, plus room for decoder threads' stacks and allocator arenas, then decodes. When it
ends, its memory goes back to the system with it: the worker never holds a decoded pixel.

How a child ends is a named refusal, never an exception the worker dies of:
`media.too_costly` (the estimate is past `Isolation.max_memory`, or the decoder ran out of the
memory the child had), `media.decode_timeout` (it ran past its timeout, and was killed),
`media.decoder_crashed` (a decoder bug killed it with a signal). Any exception a decoder raises
in the child is a refusal as well (`probe.decoder_failed`: this is the one place contributor
bytes are decoded, so the rule is written here once), logged with the module and function it
came from, never its message (a decoder may quote the file); only a failure of the host (a full
disk, a file limit) is an error, which the stage retries (`DecodeHostError`).

What the decoders write to their standard error goes to a temporary file that never has a name
(opened unlinked, its descriptor handed to the child): a parent killed mid-decode leaves no file
behind. A child whose parent is killed ends by itself once past its timeout (`SIGALRM`).

multiprocessing, not pebble: pebble's pools reuse their workers, so one decode's heap
fragmentation and its memory limit would carry into the next item, and its one-process-per-call
decorator forks the caller (here a worker with threads and a large heap). One fresh child per
decode from a preloaded forkserver, a pipe, `poll(timeout)` and `kill` are a few lines of the
standard library, and `setrlimit` runs in the child before the decoder does.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import resource
import signal
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.context import ForkServerContext
from typing import IO, Any, TypeVar, cast

from headrace.pipelines.moderation.probe import (
    DECODE_TIMEOUT,
    DECODER_CRASHED,
    TOO_COSTLY,
    Probed,
    Refused,
    decoder_failed,
)
from headrace.policy.errors import ConfigError, Transient

log = logging.getLogger("headrace.moderation")

T = TypeVar("T")
PRELOAD = [
    "headrace.pipelines.moderation.probe",
    "headrace.pipelines.moderation.derive",
    "headrace.pipelines.moderation.isolate",
]
HEADER_MEMORY = 256 << 20  # what reading headers (and the trailing-data walk) may take
THREAD_ROOM = 160 << 20  # decoder threads' stacks and malloc arenas: mapped, mostly untouched
OUT_OF_MEMORY = ("failed to allocate", "out of memory", "cannot allocate memory")
M_ARENA_MAX = -8  # glibc's mallopt option number
LARGE_NICE = 19  # the lowest: CFS gives a nice-0 process about 68 times its CPU
ARENAS = 2  # each arena reserves 64 MiB of address space: few, or the limit is spent on them
ORPHAN_SLACK = 5.0  # seconds past its timeout an orphaned child gives itself before it ends
HOST_ERROR = "media.decode_host_error"


class DecodeHostError(Transient):
    """Decoding failed for a reason of the host's (a full disk, a file limit), not the
    file's: retried, as any transient failure."""

    def __init__(self, message: str) -> None:
        super().__init__(f"decoding failed on this host: {message}", code=HOST_ERROR)


@dataclass(frozen=True)
class Isolation:
    """What a decoding child may use: `max_memory` bytes of estimated decode memory (past it
    an item is `media.too_costly` unopened), `timeout` seconds of wall-clock time. A decode
    estimated past `large` bytes (an at-limit PNG, a video) runs at the lowest CPU priority
    (nice 19), so on a busy worker the photos decoded beside it keep their pace: it still has
    every cycle they leave."""

    max_memory: int = 1 << 30
    timeout: float = 120.0
    large: int = 96 << 20

    def __post_init__(self) -> None:
        if isinstance(self.max_memory, bool) or not isinstance(self.max_memory, int):
            raise ConfigError(f"isolation.max_memory: expected bytes, got {self.max_memory!r}")
        if self.max_memory <= 0:
            raise ConfigError("isolation.max_memory: expected > 0")
        if not isinstance(self.timeout, int | float) or not self.timeout > 0:
            raise ConfigError(f"isolation.timeout: expected seconds > 0, got {self.timeout!r}")
        if isinstance(self.large, bool) or not isinstance(self.large, int) or self.large < 0:
            raise ConfigError(f"isolation.large: expected bytes >= 0, got {self.large!r}")


DEFAULT_ISOLATION = Isolation()

_context: ForkServerContext | None = None
_context_lock = threading.Lock()


# The longest temporary directory under which multiprocessing's own directory and the
# forkserver's socket in it ("/pymp-xxxxxxxx/listener-xxxxxxxx") fit a Unix socket's 107 bytes.
SOCKET_BASE_MOST = 70


def _forkserver() -> ForkServerContext:
    global _context  # one forkserver per process, started on first use
    with _context_lock:
        if _context is None:
            _short_socket_directory()
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            _context = context
        return _context


def _short_socket_directory() -> None:
    """multiprocessing keeps the forkserver's socket in a directory of its own, made under the
    temporary directory once per process. Under a deep TMPDIR (a service's scratch directory)
    the socket's path is too long for a Unix socket, and every decode failed with "AF_UNIX
    path too long": then that directory is made in /tmp instead (as Python 3.13 does). Once
    per process, under the forkserver's lock: a temporary file another thread makes in that
    instant lands in /tmp as well."""
    if len(tempfile.gettempdir()) <= SOCKET_BASE_MOST or not os.access("/tmp", os.W_OK):
        return
    chosen, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        multiprocessing.util.get_temp_dir()  # made now, and kept for this process
    finally:
        tempfile.tempdir = chosen


def run_isolated(
    work: Callable[..., T],
    sizing: Callable[[], Probed] | None,
    *args: Any,
    isolation: Isolation = DEFAULT_ISOLATION,
) -> T:
    """`work(probed, *args)` in a fresh child, where `probed = sizing()` (run there first,
    under `HEADER_MEMORY`: `probe.inspect`) sizes the child's memory limit; Refused for every
    way it may fail (see the module's docstring). `work` and `sizing` must be importable
    module functions (or `functools.partial`s of them): they cross to the child by name."""
    receiver, sender = _forkserver().Pipe(duplex=False)
    with tempfile.TemporaryFile(prefix="decode.", suffix=".err") as errors:  # no name: see above
        child = _forkserver().Process(
            target=_child,
            args=(sender, Inherited(errors.fileno()), work, sizing, args, isolation),
            daemon=True,
        )
        child.start()
        sender.close()
        try:
            return cast(T, _outcome(child, receiver, isolation.timeout, errors))
        finally:
            receiver.close()
            if child.is_alive():
                child.kill()
            child.join()
            child.close()


class Inherited:
    """A file descriptor handed to a decoding child: duplicated into it as multiprocessing
    hands over a pipe's end (`reduction.DupFd`), so the file it names needs no name."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Callable[[Any], int], tuple[Any]]:
        return _detached, (reduction.DupFd(self.fd),)


def _detached(duplicate: Any) -> int:
    descriptor: int = duplicate.detach()
    return descriptor


def _outcome(
    child: multiprocessing.process.BaseProcess,
    receiver: multiprocessing.connection.Connection,
    timeout: float,
    errors: IO[bytes],
) -> object:
    if not receiver.poll(timeout):
        child.kill()
        raise Refused(DECODE_TIMEOUT, f"decoding ran past {timeout:g} s")
    try:
        kind, value = receiver.recv()
    except EOFError:  # the child died before it answered
        child.join()
        raise _death(child.exitcode, errors) from None
    if kind == "refused":
        raise value
    if kind == "failed":  # a decoder's exception: refused, and where it came from logged
        refused, origin = value
        log.warning("a decoder failed on a file (%s): refused as %s", origin, refused.code)
        raise refused
    if kind == "error":
        raise DecodeHostError(value)  # the host's, not the file's: the stage retries it
    return value


def _death(exitcode: int | None, errors: IO[bytes]) -> Refused:
    # GLib aborts the process when an allocation fails (libvips allocates through it): what
    # it wrote on its way out tells running out of the limit from any other crash.
    errors.seek(0, os.SEEK_END)
    errors.seek(max(0, errors.tell() - 4096))
    said = errors.read().decode("utf-8", "replace").lower()
    if any(words in said for words in OUT_OF_MEMORY):
        return Refused(TOO_COSTLY, "decoding it ran out of the memory allowed")
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return Refused(DECODER_CRASHED, f"the decoder was killed by {name}")
    return Refused(DECODER_CRASHED, f"the decoder exited with status {exitcode}")


def _child(
    sender: multiprocessing.connection.Connection,
    errors: int,
    work: Callable[..., object],
    sizing: Callable[[], Probed] | None,
    args: tuple[Any, ...],
    isolation: Isolation,
) -> None:
    signal.alarm(math.ceil(isolation.timeout + ORPHAN_SLACK))  # its parent may be gone
    _few_arenas()
    os.dup2(errors, 2)  # the decoders' own words go to the parent's file
    os.close(errors)
    try:
        _limit(HEADER_MEMORY)
        probed = sizing() if sizing is not None else None
        if probed is not None:
            if probed.memory > isolation.max_memory:
                raise Refused(
                    TOO_COSTLY,
                    f"decoding it would take about {probed.memory >> 20} MiB, "
                    f"more than {isolation.max_memory >> 20}",
                )
            _limit(2 * probed.memory)
            if probed.memory > isolation.large:
                os.nice(LARGE_NICE)  # photos' decodes beside it go first on a busy CPU
        answer: tuple[str, object] = ("ok", work(probed, *args))
    except Refused as refused:
        answer = ("refused", refused)
    except MemoryError:
        answer = ("refused", Refused(TOO_COSTLY, "decoding it ran out of the memory allowed"))
    except Exception as error:  # reported to the parent, never silently dropped
        answer = _failure(error)
    sender.send(answer)
    sender.close()


def _failure(error: Exception) -> tuple[str, object]:
    """What the parent is told of an exception in the child: a refusal and where the decoder
    raised it (`decoder_failed`), or the host's error."""
    refused = decoder_failed(error)
    if refused is None:
        return ("error", f"{type(error).__name__}: {error}")
    return ("failed", (refused, _origin(error)))


def _origin(error: Exception) -> str:
    """`NotImplementedError in DdsImagePlugin.py:_open`: the exception's type and where it
    was raised, no message (a decoder may quote the file's bytes)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" in {os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else ""
    return f"{type(error).__name__}{where}"


def _limit(room: int) -> None:
    """Cap the child's address space at what it has mapped now (the measured base: the
    interpreter, the decoders' libraries, the header pass), plus `room`, plus room for
    threads."""
    base = _mapped()
    limit = base + room + THREAD_ROOM
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _mapped() -> int:
    """This process's virtual size (VmSize), in bytes."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[0])
    return pages * resource.getpagesize()


def _few_arenas() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, ARENAS)
