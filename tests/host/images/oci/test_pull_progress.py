"""The build log's download progress of a layer (pull.py's throttled_progress, fed by the
registry client per chunk): a line per quarter of the layer, or per PROGRESS_INTERVAL_S on a
slow one, never one per chunk. Pure logic: a clock of the test's, no registry."""

from __future__ import annotations

from pandastack.cli.template import STATUS_RE
from pandastack.host.images.oci.manifest import Descriptor
from pandastack.host.images.oci.pull import MIB, PROGRESS_INTERVAL_S, throttled_progress

FIRST = Descriptor(media_type="", digest="sha256:" + "a" * 64, size=40 * MIB)
SECOND = Descriptor(media_type="", digest="sha256:" + "b" * 64, size=4 * MIB)
CHUNK = 64 << 10


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fast_download_says_each_quarter_once() -> None:
    lines: list[str] = []
    on_bytes = throttled_progress(lines.append, (FIRST, SECOND), clock=Clock())
    for done in range(CHUNK, FIRST.size + 1, CHUNK):  # 640 chunks, no time passing
        on_bytes(FIRST.digest, done, FIRST.size)
    assert lines == [f"layer 1/2 sha256:aaaaaaaaaaaa: {p} % ({m:.1f} of 40.0 MiB)"
                     for p, m in ((25, 10), (50, 20), (75, 30), (100, 40))]
    # The spinner of `pandastack template build` shows them as it shows steps.
    assert all(STATUS_RE.match(line) for line in lines)


def test_a_slow_download_says_how_far_every_interval() -> None:
    lines: list[str] = []
    clock = Clock()
    on_bytes = throttled_progress(lines.append, (FIRST, SECOND), clock=clock)
    # A chunk a second (64 KiB/s) for 10 s: within the first quarter, a line every 2 s from
    # the first chunk's arrival (seconds 3, 5, 7, 9).
    for second in range(1, 11):
        clock.now += 1.0
        on_bytes(SECOND.digest, second * CHUNK, SECOND.size)
    assert len(lines) == 4 and PROGRESS_INTERVAL_S == 2.0
    assert lines[0] == "layer 2/2 sha256:bbbbbbbbbbbb: 4 % (0.2 of 4.0 MiB)"
    # A stall: the bytes so far once, then nothing more until more bytes come.
    for _ in range(3):
        clock.now += 60
        on_bytes(SECOND.digest, 10 * CHUNK, SECOND.size)
    assert lines[4:] == ["layer 2/2 sha256:bbbbbbbbbbbb: 15 % (0.6 of 4.0 MiB)"]


def test_layers_are_throttled_apart() -> None:
    lines: list[str] = []
    on_bytes = throttled_progress(lines.append, (FIRST, SECOND), clock=Clock())
    on_bytes(FIRST.digest, FIRST.size // 2, FIRST.size)
    on_bytes(SECOND.digest, SECOND.size, SECOND.size)
    on_bytes(FIRST.digest, FIRST.size // 2 + CHUNK, FIRST.size)  # still its second quarter
    assert lines == ["layer 1/2 sha256:aaaaaaaaaaaa: 50 % (20.0 of 40.0 MiB)",
                     "layer 2/2 sha256:bbbbbbbbbbbb: 100 % (4.0 of 4.0 MiB)"]
