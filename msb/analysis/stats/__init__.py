"""Statistics on scores from counts: image-level bootstrap CIs (``bootstrap``, ``bootstrap_kernels``),
significance tests (``significance``), ranking and its sensitivity (``ranking``), paired system comparisons
(``compare``), sub-populations (``populations``) and training-pool contrasts (``contrasts``).

May import :mod:`msb.analysis.counts`; never :mod:`msb.analysis.report` or :mod:`msb.analysis.protocol`.
"""
