"""Decoding in a child process: a file that would take more memory than a child may have is
`media.too_costly`, a decode past its timeout `media.decode_timeout`, a crashed decoder
`media.decoder_crashed`, any exception a decoder raises a refusal (the host's own failure
aside); the calling process lives on and holds none of the decode's memory, and a parent killed
mid-decode leaves no file behind.

Real processes and real time on purpose (a child's limit and timeout are the point), bounded."""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from headrace.pipelines.moderation import derive, samples
from headrace.pipelines.moderation.isolate import (
    LARGE_NICE,
    ORPHAN_SLACK,
    DecodeHostError,
    Isolation,
    run_isolated,
)
from headrace.pipelines.moderation.probe import (
    CORRUPT,
    DECODE_TIMEOUT,
    DECODER_CRASHED,
    TOO_COSTLY,
    UNSUPPORTED,
    Probed,
    Refused,
    decode_fully,
    inspect,
)

pytestmark = pytest.mark.realtime
ROOT = Path(__file__).resolve().parents[2]
SIDE = 7071  # just under the image class's 50 Mpx


def validated(found: Probed, original: Path) -> Probed:
    decode_fully(original, found)
    return found


def derived(found: Probed, original: Path, into: Path) -> dict[str, object]:
    return derive.derive(original, found, into)


def killed(found: Probed | None) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)  # as a decoder bug would end it


def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(scope="module")
def at_limit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("media") / "at-limit.png"
    path.write_bytes(samples.rgba_png(SIDE, SIDE))
    return path


def sized(path: Path) -> functools.partial[Probed]:
    return functools.partial(inspect, path, None)


def test_an_at_limit_png_is_validated_and_derived_without_the_caller_growing(
    at_limit: Path, tmp_path: Path
) -> None:
    before = resident()
    found = run_isolated(validated, sized(at_limit), at_limit)
    assert (found.width, found.height) == (SIDE, SIDE)
    assert found.memory < 200 << 20  # streamed: a strip of rows, not 200 MB of pixels
    metadata = run_isolated(derived, sized(at_limit), at_limit, tmp_path)
    assert metadata["files"] == [derive.PREVIEW, derive.THUMBNAIL]
    assert resident() - before < 32 << 20  # the pixels were the child's, and went with it


def test_an_estimate_past_what_a_child_may_use_is_too_costly_unopened(at_limit: Path) -> None:
    with pytest.raises(Refused) as refused:
        run_isolated(validated, sized(at_limit), at_limit, isolation=Isolation(max_memory=1 << 20))
    assert refused.value.code == TOO_COSTLY
    assert "MiB" in refused.value.message


def test_a_decode_that_runs_out_of_the_childs_memory_is_too_costly(tmp_path: Path) -> None:
    # A GIF is decoded whole (144 MB of RGBA here, twice over); sized as a header that
    # understates its cost would be, the child's limit is far below what the decoder asks for.
    original = tmp_path / "whole.gif"
    Image.linear_gradient("L").resize((6000, 6000)).save(original, "GIF")
    lying = functools.partial(_streamed_estimate, original)
    with pytest.raises(Refused) as refused:
        run_isolated(validated, lying, original)
    assert refused.value.code == TOO_COSTLY


def _streamed_estimate(path: Path) -> Probed:
    found = inspect(path)
    return Probed(found.media_class, found.format, found.size, found.width, found.height)


def test_a_decode_past_its_timeout_is_killed_and_named(at_limit: Path) -> None:
    with pytest.raises(Refused) as refused:
        run_isolated(validated, sized(at_limit), at_limit, isolation=Isolation(timeout=0.05))
    assert refused.value.code == DECODE_TIMEOUT


def test_a_decoder_killed_by_a_signal_is_a_refusal_not_a_crash() -> None:
    with pytest.raises(Refused) as refused:
        run_isolated(killed, None)
    assert refused.value.code == DECODER_CRASHED
    assert "SIGSEGV" in refused.value.message


@pytest.mark.parametrize(
    ("max_memory", "timeout"), [(0, 1.0), (-1, 1.0), (True, 1.0), (1 << 20, 0), (1 << 20, "1")]
)
def test_isolation_names_its_bad_field(max_memory: object, timeout: object) -> None:
    with pytest.raises(ValueError, match="isolation"):
        Isolation(max_memory=max_memory, timeout=timeout)  # type: ignore[arg-type]


def niceness(found: Probed | None) -> int:
    return os.nice(0)


def test_a_large_decode_yields_the_cpu_and_a_photo_does_not(at_limit: Path, tmp_path: Path) -> None:
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(samples.jpeg(640, 480))
    base = os.nice(0)
    assert run_isolated(niceness, sized(photo)) == base
    large = min(19, base + LARGE_NICE)  # an at-limit PNG: large
    assert run_isolated(niceness, sized(at_limit)) == large
    no_line = Isolation(large=1 << 40)
    assert run_isolated(niceness, sized(at_limit), isolation=no_line) == base


def test_a_deep_temporary_directory_does_not_stop_decoding(tmp_path: Path) -> None:
    """The forkserver's socket lives under the temporary directory: under a TMPDIR too deep for
    a Unix socket's path, a decode still runs (it failed with "AF_UNIX path too long"). In a
    process of its own: the directory is chosen once per process."""
    deep = tmp_path / ("d" * 40) / ("e" * 40)
    deep.mkdir(parents=True)
    image = tmp_path / "small.png"
    image.write_bytes(samples.rgba_png(32, 32))
    program = (
        "import functools, sys\n"
        "from pathlib import Path\n"
        "from headrace.pipelines.moderation.isolate import run_isolated\n"
        "from headrace.pipelines.moderation.probe import inspect\n"
        "from tests.unit.test_moderation_isolate import validated\n"
        "path = Path(sys.argv[1])\n"
        "print(run_isolated(validated, functools.partial(inspect, path, None), path).format)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(image)],
        env={**os.environ, "TMPDIR": str(deep)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "png"


def unimplemented(found: Probed | None) -> None:
    raise NotImplementedError("pixel format ZZZZ")  # as Pillow's DDS plugin raises


def out_of_range(found: Probed | None) -> None:
    raise IndexError("tuple index out of range")  # as a fuzzed header makes a parser raise


def disk_full(found: Probed | None) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_what_a_decoder_raises_is_a_refusal_and_a_failure_of_the_host_is_not(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.WARNING, "headrace.moderation")
    for work, code in ((unimplemented, UNSUPPORTED), (out_of_range, CORRUPT)):
        with pytest.raises(Refused) as refused:
            run_isolated(work, None)
        assert refused.value.code == code
        assert "ZZZZ" not in refused.value.message and "tuple" not in refused.value.message
    said = caplog.text
    assert "IndexError in test_moderation_isolate.py:out_of_range" in said
    assert "ZZZZ" not in said  # where it came from, never what it said
    with pytest.raises(DecodeHostError) as failed:
        run_isolated(disk_full, None)
    assert failed.value.code == "media.decode_host_error"
    dds = tmp_path / "texture.dds"  # Pillow raises NotImplementedError opening it
    dds.write_bytes(samples.unimplemented_dds())
    with pytest.raises(Refused) as refused:
        run_isolated(validated, sized(dds), dds)
    assert refused.value.code == UNSUPPORTED


def sleeping(found: Probed | None, started: Path) -> None:
    started.write_text(str(os.getpid()))
    time.sleep(60)


def test_a_parent_killed_mid_decode_leaves_no_file_and_its_child_ends(tmp_path: Path) -> None:
    """The decoders' error file never has a name in the temporary directory (67 were left
    there after a day of killed workers), and the orphaned child ends once past its timeout."""
    scratch, started = tmp_path / "tmp", tmp_path / "started"
    scratch.mkdir()
    program = (
        "import sys\n"
        "from pathlib import Path\n"
        "from headrace.pipelines.moderation.isolate import Isolation, run_isolated\n"
        "from tests.unit.test_moderation_isolate import sleeping\n"
        "run_isolated(sleeping, None, Path(sys.argv[1]), isolation=Isolation(timeout=1.0))\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", program, str(started)],
        env={**os.environ, "TMPDIR": str(scratch)},
        cwd=ROOT,
    )
    deadline = time.monotonic() + 60
    while not started.exists() or not started.read_text():
        assert time.monotonic() < deadline and parent.poll() is None, "the decode never started"
        time.sleep(0.05)
    child = int(started.read_text())
    parent.kill()  # as the OOM killer or kill -9 ends a worker
    parent.wait()
    assert [p.name for p in scratch.rglob("decode.*")] == []
    deadline = time.monotonic() + 1.0 + ORPHAN_SLACK + 10
    while _running(child):
        assert time.monotonic() < deadline, "the orphaned decoding child never ended"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie no one reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
