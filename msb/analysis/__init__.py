"""The post-hoc stage: everything computed from a study's stored artifacts (counts, predictions, manifests),
never from a network. Four sub-packages, data flowing one way:

- :mod:`msb.analysis.counts`: read, check and re-aggregate count files; imports no other sub-package.
- :mod:`msb.analysis.stats`: bootstrap CIs, significance tests, ranking, paired comparisons, populations,
  training-pool contrasts; imports ``counts`` only.
- :mod:`msb.analysis.report`: the HTML/Markdown report, its data, sections, tables, figures, leaderboard,
  contract and legacy table; imports ``counts`` and ``stats``.
- :mod:`msb.analysis.protocol`: the published protocols' analyses (tables and figures in the papers' layout);
  imports ``counts``, ``stats`` and the report's writers (tables, figures, contract, summary).

``tests/test_layout.py`` checks the ``counts -> stats -> report`` direction on the real import graph.
"""
