"""Count files: reading and checking them (``counts_io``, ``counts_arrow``, ``counts_files``), the aggregation
rules and scores (``rules``, ``aggregate``, ``aggregate_core``, ``count_scores``, ``reaggregate_fast``), and what
identifies a system (``systems``, ``identical``).

Owns the raw-count-first contract: every score is a function of TP/FP/FN/TN rows. Imports nothing else from
:mod:`msb.analysis` (neither ``stats`` nor ``report``).
"""
