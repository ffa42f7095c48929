"""Named fault points for the fault-injection tests (``tests/faults/``).

Code that writes resumable state calls :func:`fault_point` with a name at the moments where an interruption
matters (e.g. ``save_state:state_renamed``, between installing a new resume state and its digest). When the
environment variable ``MSB_FAULT_KILL_AT`` names that point, the process kills itself with ``SIGKILL`` there
(the same as ``kill -9`` at that exact moment, without sleeping or polling). ``MSB_FAULT_KILL_AT=name@N``
kills at the N-th time the point is reached in the process (1-based). Unset (the normal case), a fault point does nothing.
"""

from __future__ import annotations

import os
import signal

__all__ = ["FAULT_ENV", "fault_point"]

FAULT_ENV = "MSB_FAULT_KILL_AT"

_hits: dict[str, int] = {}


def fault_point(name: str) -> None:
    """Kill this process with ``SIGKILL`` if ``MSB_FAULT_KILL_AT`` names ``name`` (``name`` or ``name@N``,
    N = the 1-based count of times this point has been reached in this process); otherwise do nothing."""
    want = os.environ.get(FAULT_ENV)
    if not want:
        return
    target, _, nth = want.partition("@")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= (int(nth) if nth.strip() else 1):
        os.kill(os.getpid(), signal.SIGKILL)
