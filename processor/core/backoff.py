"""How long to wait before the next try at a dependency that is down (a database connection,
a broker that does not acknowledge): capped exponential backoff.

The first retry comes quickly (a restart is often over in well under a second), each further
one waits twice as long, and the wait never exceeds the cap, so a service that comes back is
noticed within the cap while a long outage costs a try every few seconds, not a hot loop.
"""

from __future__ import annotations

FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0
# 2**64 times any first wait is far past any cap: no need to compute larger powers.
_MAX_DOUBLINGS = 64


def retry_delay_s(
    retries_made: int, first_s: float = FIRST_RETRY_S, cap_s: float = MAX_RETRY_S
) -> float:
    """The wait before retry number ``retries_made + 1``: ``first_s * 2**retries_made``, at most
    ``cap_s`` (0.1, 0.2, 0.4 ... 3.2, then 5 s with the defaults)."""
    if retries_made < 0:
        raise ValueError(f"retries_made must be >= 0, not {retries_made}")
    if not 0 < first_s <= cap_s:
        raise ValueError(f"need 0 < first_s <= cap_s, not {first_s} and {cap_s}")
    return min(cap_s, first_s * 2.0 ** min(retries_made, _MAX_DOUBLINGS))
