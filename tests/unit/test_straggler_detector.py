"""The straggler detector's arithmetic (its wiring: ``test_stragglers.py``)."""

from phalanx.stragglers.rates import StragglerDetector


def feed(detector: StragglerDetector, rates: dict[str, float], seconds: int) -> dict:
    named: dict = {}
    for t in range(seconds + 1):
        named = detector.observe(float(t), {k: int(r * t) for k, r in rates.items()})
    return named


def test_a_rank_below_the_fraction_of_its_peers_is_named_with_its_rate() -> None:
    named = feed(StragglerDetector(fraction=0.5, window_s=5), {"0": 10, "1": 10, "2": 2}, 10)
    assert set(named) == {"2"}
    rate, median = named["2"]
    assert rate < 0.5 * median


def test_healthy_ranks_and_a_short_watch_name_nobody() -> None:
    assert feed(StragglerDetector(fraction=0.5, window_s=5), {"0": 10, "1": 9, "2": 7}, 10) == {}
    # a slow rank not yet watched for a whole window is not judged
    assert feed(StragglerDetector(fraction=0.5, window_s=30), {"0": 10, "1": 1}, 10) == {}


def test_all_paused_names_nobody() -> None:
    assert feed(StragglerDetector(fraction=0.5, window_s=5), {"0": 0, "1": 0}, 10) == {}


def test_a_rank_not_stepping_yet_is_not_judged() -> None:
    """Startup (imports, the process group) is no straggling: the window starts at a first beat."""
    detector = StragglerDetector(fraction=0.5, window_s=5)
    named: dict = {}
    for t in range(12):
        named = detector.observe(float(t), {"0": 10 * t, "1": 10 * t, "2": 0 if t < 9 else 10})
    assert named == {}


def test_a_rank_waiting_at_a_barrier_is_not_a_straggler() -> None:
    """Rank 2 finished its share and waits (its counter stopped): not slow, not judged."""
    detector = StragglerDetector(fraction=0.5, window_s=5)
    named: dict = {}
    for t in range(1, 15):
        named = detector.observe(float(t), {"0": 10 * t, "1": 10 * t, "2": 10 * min(t, 8)})
    assert named == {}
