"""The one backoff rule and the one crash-loop rule, for everything that retries.

Pure (stdlib only): the env actors, the driver, the pool server, the operator's
reconcile retries and the pool server's EnvPool watch use these.

    >>> [backoff(1.0, n, 60.0) for n in range(8)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
"""

from __future__ import annotations

#: Exponents past this change nothing after the cap but could overflow a float.
_MAX_EXPONENT = 30


def backoff(base: float, attempt: int, cap: float) -> float:
    """``base * 2**attempt`` seconds, at most ``cap``; 0 when ``base`` is 0.

    ``attempt`` counts from 0 (the first retry waits ``base``).
    """
    if base <= 0 or attempt < 0:
        return 0.0
    return float(min(base * 2.0 ** min(attempt, _MAX_EXPONENT), cap))
