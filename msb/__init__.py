"""MedSegBenchmarker (``msb``): raw-count-first benchmarking of 2D medical image segmentation.

Stages (one sub-package each, data flows one way):
``config`` -> ``data`` -> ``models`` -> ``engine`` (training) -> ``evaluation`` (counts, predictions)
-> ``analysis`` (re-aggregation, tables).
"""

__version__ = "0.1.0"
