"""The study report and what it is made of: the builder (``report``), its data (``report_data``), document
(``report_doc``, ``templates/``), first screen (``report_summary``), protocol and contrast sections
(``report_protocol``, ``report_contrasts``), tables and figures (``tables``, ``figures``, ``figures_study``),
the console leaderboard (``leaderboard``), the study contract (``contract``), the summary rows (``summary``) and
the legacy six-metric table (``legacy_table``).

May import :mod:`msb.analysis.counts` and :mod:`msb.analysis.stats` (and the protocol analyses for its protocol
section); neither of those imports this package.
"""
