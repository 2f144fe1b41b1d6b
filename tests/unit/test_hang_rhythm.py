"""The hang watch's bounds (``phalanx.hang.rhythm``) and its settings, driven by a fake clock:
start-up grace, the rhythm's p99, pauses left out of the rhythm, stragglers."""

from __future__ import annotations

import pytest

from phalanx.hang.rhythm import STARTUP_BEATS, WINDOW, RhythmDetector
from phalanx.hang.settings import HangWatch, parse_hang_watch


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def steps(detector: RhythmDetector, clock: Clock, gaps: list[float], paused: bool = False) -> None:
    """Rank 0 beats once after each gap (one reading per beat, as a tick sees it)."""
    beats = detector.progress(0)[0]
    for gap in gaps:
        clock.now += gap
        beats += 1
        detector.observe(0, (beats, beats), paused, None)


def watch(**settings: float) -> tuple[RhythmDetector, Clock]:
    clock = Clock()
    detector = RhythmDetector(HangWatch(**settings), clock)
    detector.observe(0, None, False, 0)
    return detector, clock


def test_before_its_rhythm_a_rank_has_the_grace_and_is_never_failed() -> None:
    detector, clock = watch(floor=10, factor=5, grace=100)
    steps(detector, clock, [400.0])  # a first step of 400 s: no gap, and the grace
    assert detector.bound(0)[:2] == (100, False)
    steps(detector, clock, [1.0] * (STARTUP_BEATS - 1))
    assert detector.bound(0)[:2] == (10, True)  # 5 x 1 s: the floor


def test_slow_steps_from_the_start_make_a_long_bound() -> None:
    detector, clock = watch(floor=10, factor=5, grace=100)
    steps(detector, clock, [600.0] * STARTUP_BEATS)  # ten minutes a step, from the first
    assert detector.bound(0)[:2] == (3000, True)


def test_the_bound_is_factor_times_the_p99_of_its_gaps_and_never_below_the_floor() -> None:
    detector, clock = watch(floor=10, factor=5, grace=100)
    steps(detector, clock, [1.0] * (STARTUP_BEATS + 50))
    assert detector.bound(0).seconds == 10  # 5 x 1 s: the floor
    steps(detector, clock, [1.0] * 9 + [4.0])  # an evaluation every ten steps
    bound = detector.bound(0)
    assert bound.seconds == 20 and bound.acts and "p99 gap 4.00 s" in bound.rule
    steps(detector, clock, [1.0] * 300)  # 1 in 360 gaps is 4 s: past the 99th percentile
    assert detector.bound(0).seconds == 10


def test_a_straggler_has_its_own_slower_rhythm() -> None:
    detector, clock = watch(floor=1, factor=5, grace=100)
    steps(detector, clock, [2.0] * 20)
    assert detector.bound(0).seconds == 10


def test_a_pause_holds_the_rank_to_the_grace_and_stays_out_of_its_rhythm() -> None:
    detector, clock = watch(floor=10, factor=5, grace=100)
    steps(detector, clock, [1.0] * 10)
    clock.now += 1
    detector.observe(0, (10, 10), True, None)  # entered a pause: no beat
    assert detector.bound(0)[:2] == (100, False)
    clock.now += 60
    steps(detector, clock, [0.0])  # the pause ends with a beat
    steps(detector, clock, [1.0] * 3)
    assert detector.bound(0).seconds == 10  # the 61 s gap is not in the rhythm


def test_before_the_first_beat_cpu_time_is_progress() -> None:
    detector, clock = watch()
    clock.now = 50
    assert detector.observe(0, (0, -1), False, 7) == 50  # the main thread ran: it moved
    assert detector.idle(0) == 0 and detector.wants_cpu(0)
    steps(detector, clock, [1.0])
    assert not detector.wants_cpu(0)


def test_the_window_keeps_the_last_gaps() -> None:
    detector, clock = watch(floor=1, factor=1, grace=100)
    steps(detector, clock, [1.0] * STARTUP_BEATS + [9.0] + [2.0] * 50)
    assert detector.bound(0).seconds == 9  # under 100 gaps, the p99 is the longest
    steps(detector, clock, [2.0] * WINDOW)
    assert detector.bound(0).seconds == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("on", HangWatch()),
        ("ON", HangWatch()),
        ("off", None),
        ("floor=2", HangWatch(floor=2)),
        ("floor=2, factor=3,grace=9", HangWatch(2, 3, 9)),
    ],
)
def test_the_settings(text: str, expected: HangWatch | None) -> None:
    assert parse_hang_watch(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yes", "--hang-watch: expected on, off, or floor=60,factor=5,grace=300, got 'yes'"),
        ("floor", "--hang-watch: expected on, off, or floor=60,factor=5,grace=300, got 'floor'"),
        ("bound=3", "--hang-watch: expected on, off"),
        ("floor=inf", "--hang-watch: floor must be above 0, got inf"),
        ("factor=0.9", "--hang-watch: factor must be 1 or more, got 0.9"),
    ],
)
def test_bad_settings_say_what_to_change(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        parse_hang_watch(text)
