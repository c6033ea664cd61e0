"""The local sandbox backend waits for its namespace agent's first line on a pipe
(services/sandbox/backends/local.py). A gym serving many connections holds more than 1,024
descriptors, so that pipe can be numbered past what ``select`` takes: the wait must still work
(with ``select`` every sandbox create failed with a 500, ValueError)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from services.sandbox.backends.local import _readline_with_timeout


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    """This process holds descriptors up to past 1,100, so the next pipe is numbered past 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1_200:
        if hard != resource.RLIM_INFINITY and hard < 1_200:
            pytest.fail(f"the descriptor limit is {hard}; this test needs 1,200")  # never skipped
        resource.setrlimit(resource.RLIMIT_NOFILE, (1_200, hard))
    held: list[int] = []
    try:
        base = os.open(os.devnull, os.O_RDONLY)
        held.append(base)
        while held[-1] < 1_100:
            held.append(os.dup(base))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_line_on_a_pipe_numbered_past_1024_is_read_and_silence_times_out(many_descriptors: None) -> None:
    read_fd, write_fd = os.pipe()
    assert read_fd >= 1_024
    with os.fdopen(read_fd, "rb") as stream, os.fdopen(write_fd, "wb") as writer:
        assert _readline_with_timeout(stream, 0.05) is None  # nothing written: the wait runs out
        writer.write(b"ready\n")
        writer.flush()
        assert _readline_with_timeout(stream, 5) == b"ready\n"
