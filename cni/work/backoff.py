"""How long to wait before trying again after a failure (an API request, a work item).

Exponential, capped, with jitter: the n-th failure in a row waits a random time
in ``[c/2, c]``, where ``c = min(cap, base * 2**n)``. The lower half bounds how
often one client can ask (at most one request per ``cap/2`` once the failures
persist); the random half spreads the clients of one cluster apart, so that the
agents of every node, broken off by the same event, do not come back in step.
"""

from __future__ import annotations

import random
from collections.abc import Callable

BASE_SECONDS = 0.8  # the first wait is 0.4 to 0.8 s
CAP_SECONDS = 30.0  # persisting failures: one try every 15 to 30 s
# A watch open this long was a working one: the next failure waits the least again;
# one that ends sooner counts as a failure.
HEALTHY_WATCH_SECONDS = 5.0


class Backoff:
    def __init__(
        self,
        base: float = BASE_SECONDS,
        cap: float = CAP_SECONDS,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"backoff needs 0 < base ({base} s) <= cap ({cap} s)")
        self.base = base
        self.cap = cap
        self.uniform = uniform  # a number in [0, 1)
        self.failures = 0  # in a row, since the last reset

    def ceiling(self, failures: int) -> float:
        """The longest wait after ``failures`` failures in a row (before this one)."""
        # 2**n grows past any cap quickly; stop computing it there.
        return min(self.cap, self.base * float(1 << min(failures, 64)))

    def next(self) -> float:
        """The wait after one more failure."""
        ceiling = self.ceiling(self.failures)
        self.failures += 1
        return ceiling / 2 + self.uniform() * ceiling / 2

    def reset(self) -> None:
        """After a success: the next failure waits the shortest again."""
        self.failures = 0
