"""Which bench figures are disturbed measurements, not figures to divide by.

The limit bounds every implementation by definition (nothing that moves envs into
other processes can beat them stepped in-process on every core), so a limit below an
implementation's figure measured something else: load beside the limit's run. A
yardstick (a peer or the limit) whose repetitions differ by more than
:data:`SPREAD` was disturbed in one of them: on the quiet 2-core VM Sync's 3 s reps
stayed within 1.05x (139,603-145,386 in README round 3), while beside RLlib's leftover
actors it fell 1.75x. remote_env's own spread is not checked: it can be its own (an
actor and the driver placed on one core), and is shown with its reps. Anything of the
bench's own still running beside a run disturbs that run. Pure functions: the bench
passes its samples in and prints what comes out.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence

#: max/min of one implementation's repetitions beyond which one of them was disturbed
SPREAD = 1.5


def disturbed(samples: Mapping[str, Sequence[float]],
              leftover: Mapping[str, Sequence[Mapping[str, int]]],
              yardsticks: Collection[str]) -> dict[str, str]:
    """impl -> why its figure is a disturbed measurement (``limit`` included).

    ``samples``: each implementation's steps/s per repetition; ``leftover``: per
    repetition, the bench's own processes that were still running beside it;
    ``yardsticks``: the implementations whose spread over repetitions is checked.
    """
    why: dict[str, list[str]] = {}
    for impl, reps in leftover.items():
        for rep, left in enumerate(reps, 1):
            if left:
                what = ", ".join(f"{k} x {v}" for v, k in sorted((v, k) for k, v in left.items()))
                why.setdefault(impl, []).append(f"rep {rep} ran beside the bench's own {what}")
    for impl, figs in samples.items():
        if impl in yardsticks and len(figs) > 1 and min(figs) > 0 and max(figs) / min(figs) > SPREAD:
            shown = " / ".join(f"{f:,.0f}" for f in figs)
            why.setdefault(impl, []).append(
                f"reps differ by {max(figs) / min(figs):.2f}x ({shown}; more than {SPREAD}x)")
    lim = samples.get("limit")
    if lim:
        limit = statistics.median(lim)
        above = {i: statistics.median(f) for i, f in samples.items() if i != "limit" and f
                 and statistics.median(f) > limit}
        if above:
            who = " and ".join(f"{i}'s {sps:,.0f}"
                               for i, sps in sorted(above.items(), key=lambda kv: -kv[1]))
            why.setdefault("limit", []).append(f"{limit:,.0f} is below {who}, which it bounds")
    return {impl: "; ".join(reasons) for impl, reasons in why.items()}


def ratio(res: Mapping[str, float], bad: Mapping[str, str], num: str, den: str) -> float | None:
    """``res[num] / res[den]``, or None when either figure is disturbed."""
    if num in bad or den in bad or not res.get(den):
        return None
    return res[num] / res[den]

