"""The waits between retries: exponential, capped, jittered; what bounds a client's
request rate and what spreads a cluster's clients apart."""

from __future__ import annotations

import random

import pytest

from cni.work.backoff import CAP_SECONDS, Backoff


def waits(backoff: Backoff, n: int) -> list[float]:
    return [backoff.next() for _ in range(n)]


def test_each_wait_lies_between_half_its_ceiling_and_its_ceiling() -> None:
    shortest = waits(Backoff(0.8, 30, uniform=lambda: 0.0), 8)
    longest = waits(Backoff(0.8, 30, uniform=lambda: 0.999999), 8)
    assert shortest == pytest.approx([0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 15, 15])
    assert longest == pytest.approx([0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30], rel=1e-5)


def test_persisting_failures_ask_at_most_once_per_half_the_cap() -> None:
    backoff = Backoff()
    seen = waits(backoff, 1000)  # no overflow, however long the failures last
    assert min(seen[10:]) >= CAP_SECONDS / 2
    assert max(seen) <= CAP_SECONDS
    # A list and a watch per failure: the first minute and every later one.
    first_minute = sum(1 for total in _running_sums(Backoff(uniform=lambda: 0.0), 40) if total < 60)
    assert 2 * (first_minute + 1) <= 20
    assert 2 * 60 / (CAP_SECONDS / 2) <= 8


def _running_sums(backoff: Backoff, n: int) -> list[float]:
    total, out = 0.0, []
    for wait in waits(backoff, n):
        total += wait
        out.append(total)
    return out


def test_a_reset_starts_again_from_the_shortest_wait() -> None:
    backoff = Backoff(1, 30, uniform=lambda: 0.0)
    waits(backoff, 6)
    backoff.reset()
    assert backoff.next() == 0.5


def test_clients_failing_together_come_back_apart() -> None:
    """A hundred agents cut off at the same moment: after five failures each, their
    next requests are spread over seconds, not bunched."""
    rng = random.Random(17)
    moments = sorted(sum(waits(Backoff(uniform=rng.random), 5)) for _ in range(100))
    assert moments[0] >= 12.4 and moments[-1] <= 24.8
    assert moments[-1] - moments[0] > 4
    # No tenth of a second holds more than a tenth of them.
    assert max(sum(1 for m in moments if t <= m < t + 0.1) for t in moments) <= 10


@pytest.mark.parametrize(("base", "cap"), [(0, 1), (2, 1), (-1, 5)])
def test_impossible_settings_are_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="base"):
        Backoff(base, cap)
