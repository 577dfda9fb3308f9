"""core.progress in plain-line mode (stderr a file or a pipe): the lines a log gets, by hand, on a fake clock."""

import io

from replay_theory.core.progress import LINE_EVERY_S, ProgressBar, clock_text


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_clock_text_by_hand():
    assert clock_text(0) == "0:00:00"
    assert clock_text(59.6) == "0:01:00"
    assert clock_text(3725.4) == "1:02:05"


def test_plain_lines_at_start_every_interval_and_end():
    stream, clock = io.StringIO(), FakeClock()
    bar = ProgressBar("units", 10, done=2, stream=stream, clock=clock)  # 2 done before: a resumed run
    clock.now += 10
    bar.advance()  # 3 of 10, 10 s after the start: no line yet (none at the start: a short command prints one)
    clock.now += LINE_EVERY_S - 10  # 30 s: a line is due at the next event
    bar.advance()  # 4 of 10: 2 items in 30 s here, 6 left -> 90 s
    clock.now += 5
    bar.tick()  # 5 s after the last line: nothing
    clock.now += 25
    bar.tick()  # 30 s after it: the same count, a later clock -> 2 items in 60 s, 6 left -> 180 s
    bar.update(10)
    bar.close()
    bar.close()  # a second close adds nothing
    assert stream.getvalue().splitlines() == [
        "units: 4/10 (40%), elapsed 0:00:30, ETA 0:01:30",
        "units: 4/10 (40%), elapsed 0:01:00, ETA 0:03:00",
        "units: 10/10 (100%), elapsed 0:01:00, ETA 0:00:00",
    ]


def test_disabled_writes_nothing():
    stream = io.StringIO()
    bar = ProgressBar("units", 3, stream=stream, enabled=False)
    bar.advance()
    bar.tick()
    bar.close()
    assert stream.getvalue() == ""
