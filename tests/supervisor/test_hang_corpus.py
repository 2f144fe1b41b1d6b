"""The hang corpus, short form (``support/hang_corpus.py``; the real-scale figures come from
``benchmarks/hang_corpus.py``): the 8 hangs and the 8 healthy but irregular runs of issue 39,
each a real 2-rank phalanx job under the hang watch with no --stall-timeout, all at once.

Real faults: a rank asleep before an all-reduce (Gloo), a busy Python loop, an all-reduce
against a broadcast, a SIGSTOPped worker, a write to a FUSE filesystem that stops answering,
two threads deadlocked, a DataLoader worker SIGKILLed under a prefetch thread, a read in C
on a pipe nobody writes. Time is scaled down to a tenth (a 2.5 s checkpoint save, a 4 s
first step, 1.5 s evaluations), the floor to 6 s and the grace to 20 s with it. One hang
(the SIGSTOP, floor 2 s) runs on into the second bound, where the round fails as a hang; one
rank silent for twice the floor and then moving again is named, said to move again, and its
job ends well; one in a phalanx.pause() for twice the floor is not named."""

from __future__ import annotations

import pytest

from support.hang_corpus import EXTRA, HANGS, HEALTHY, PAUSES, RESUMES, Outcome, figures, run_corpus

SCALE = 0.1
WATCH = "floor=6,grace=20"
FAILS = "sigstop"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp = tmp_path_factory.mktemp("corpus")
    outcomes = run_corpus(
        tmp, scale=SCALE, watch=WATCH, deadline=150, cases=(*HANGS, *HEALTHY, *EXTRA),
        fail_case=FAILS, fail_watch="floor=2,grace=20",
    )  # fmt: skip
    return {o.case: o for o in outcomes}


@pytest.mark.parametrize("case", HANGS)
def test_every_hang_is_named(corpus: dict[str, Outcome], case: str) -> None:
    o = corpus[case]
    assert o.named and set(o.ranks) <= set(o.hung), (o.hung, o.stderr)  # in status.json too
    # Named after its fault, at the bound it had (the benchmark reports the times).
    assert o.bound is not None and o.to_verdict is not None and o.to_verdict > 0
    if case != "mismatched_collectives":  # two ranks, both inside torch: no one stands out
        assert o.suspects == [1], (o.suspects, o.stderr)
    if case != FAILS:  # stopped by the test once named: the watch itself never stopped it
        assert not o.failed and o.returncode == 143, o.stderr


@pytest.mark.parametrize("case", HEALTHY)
def test_no_healthy_run_is_named(corpus: dict[str, Outcome], case: str) -> None:
    o = corpus[case]
    assert not o.named and o.returncode == 0, o.stderr


def test_the_corpus_has_full_precision_and_recall(corpus: dict[str, Outcome]) -> None:
    assert figures([o for name, o in corpus.items() if name not in EXTRA]) == (1.0, 1.0)


def test_the_round_fails_at_the_second_bound(corpus: dict[str, Outcome]) -> None:
    o = corpus[FAILS]
    assert o.named and o.failed and o.returncode == 1, o.stderr
    assert "[hang]" in o.stderr and "Root cause: rank 1" in o.stderr
    assert "(10 x max(floor 2 s" in o.stderr  # the report says which bound acted


def test_a_named_rank_that_moves_again_is_said_and_the_job_goes_on(
    corpus: dict[str, Outcome],
) -> None:
    o = corpus[RESUMES]
    assert o.named and o.resumed and not o.failed and o.returncode == 0, o.stderr
    assert "hang over: rank 1 moves again after" in o.stderr and o.hung == []


def test_a_pause_longer_than_the_floor_is_not_named(corpus: dict[str, Outcome]) -> None:
    o = corpus[PAUSES]
    assert not o.named and o.returncode == 0, o.stderr
