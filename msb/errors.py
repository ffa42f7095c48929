"""User-facing error type.

Every error caused by the user's input (a bad config key, a missing file, a mask value not covered by
``classes.csv``) is raised as :class:`MSBError`. The CLI prints its message as one line and exits with
status 2; ``--debug`` shows the traceback. Programming errors keep their own types.
"""

from __future__ import annotations


class MSBError(Exception):
    """An error in the user's input that the user can fix.

    The message must name the file, row or key at fault and say what to do.
    """


class AuditFailed(MSBError):
    """A required audit check failed (``data.require_audit``): a relation crosses the run's split.

    The message names the failed checks with their counts, the audit folder and what to do.
    """


class SizeNotDivisibleError(MSBError):
    """``data.input_size`` is not a multiple of the architecture's ``size_divisor`` (raised at generation).

    A study whose ``axes`` vary ``data.input_size`` records it as an exclusion of that architecture at that size
    instead of failing (``_study/exclusions.csv``), unless no architecture can run the size."""
