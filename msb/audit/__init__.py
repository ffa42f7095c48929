"""Duplicate and leakage audit of prepared datasets (``msb audit``).

Stage contract: reads prepared datasets (``index.csv`` + image files, :mod:`msb.data.schema`) and optionally a
split file; writes an audit folder (CSV, XLSX, HTML contact sheet, ``audit.json``, ``verdict.json``) and, on request, a curated
dataset folder whose ``index.csv`` points at the original files. It never modifies or deletes dataset files and
never imports training code.

Modules:

* :mod:`msb.audit.hashing`: SHA-256 of the file bytes, pHash and dHash (imagehash, 64 bit) packed as ``uint64``,
  grey thumbnails for the pixel screens (one decode per image);
* :mod:`msb.audit.search`: vectorised Hamming search over packed hashes, exact-value groups, connected
  components (union-find equivalent, via scipy);
* :mod:`msb.audit.content`: the fixed frame (border, overlay) left out (``--fov``): dataset and image masks,
  fingerprints of the content;
* :mod:`msb.audit.calibration`: known groups as a calibration (cross-/within-group pairs per screen and
  threshold), clusters joining groups, the default and strict predicates;
* :mod:`msb.audit.screens`: normalised cross-correlation and SSIM of candidate pairs at a stated resolution;
  all-pairs NCC (every pair, vectorised) and NCC of sampled query rows against every row;
* :mod:`msb.audit.candidates`: candidate generators (``hash`` prefilter, ``all`` pairs) and the prefilter's
  measured recall;
* :mod:`msb.audit.sources`: source/video ids from file names (``--group-pattern``);
* :mod:`msb.audit.census`: cross-boundary census with counting units and denominators;
* :mod:`msb.audit.counterparts`: counterpart rules ``first`` / ``any`` for evaluation rows;
* :mod:`msb.audit.verdict`: ``--fail-on`` checks, the verdict and its one-line summary (exit 3);
* :mod:`msb.audit.gate`: ``data.require_audit``: audit a run's split (cached by digest), refuse to train;
* :mod:`msb.audit.core`: :func:`run_audit` (orchestration) and :class:`AuditConfig`;
* :mod:`msb.audit.report`: CSV / XLSX / HTML writers;
* :mod:`msb.audit.curate`: decisions file -> curated ``index.csv``; audit clusters -> ``group``.
"""

from __future__ import annotations

import importlib

# Lazy (PEP 562): ``import msb.audit.hashing`` in a spawned hashing worker must not load core/report/curate
# (pandas, scipy, openpyxl: ~2.8 s per worker measured, docs/performance.md).
_EXPORTS = {"AuditConfig": "core", "AuditResult": "core", "run_audit": "core", "write_audit": "report",
            "apply_decisions": "curate", "read_decisions": "curate", "cluster_decisions": "curate",
            "groups_from_clusters": "curate"}

__all__ = ["AuditConfig", "AuditResult", "run_audit", "write_audit", "apply_decisions", "read_decisions",
           "cluster_decisions", "groups_from_clusters"]


def __getattr__(name: str):
    """Import the public names of the package on first use."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"msb.audit.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'msb.audit' has no attribute {name!r}")
