"""Duplicate and leakage audit of prepared datasets (``msb audit``).

Stage contract: reads prepared datasets (``index.csv`` + image files, :mod:`msb.data.schema`) and optionally a
split file; writes an audit folder (CSV, XLSX, HTML contact sheet, ``audit.json``) and, on request, a curated
dataset folder whose ``index.csv`` points at the original files. It never modifies or deletes dataset files and
never imports training code.

Modules:

* :mod:`msb.audit.hashing`: SHA-256 of the file bytes, pHash and dHash (imagehash, 64 bit) packed as ``uint64``,
  grey thumbnails for the pixel screens (one decode per image);
* :mod:`msb.audit.search`: vectorised Hamming search over packed hashes, exact-value groups, connected
  components (union-find equivalent, via scipy);
* :mod:`msb.audit.screens`: normalised cross-correlation and SSIM of candidate pairs at a stated resolution;
* :mod:`msb.audit.census`: cross-boundary census with counting units and denominators;
* :mod:`msb.audit.core`: :func:`run_audit` (orchestration) and :class:`AuditConfig`;
* :mod:`msb.audit.report`: CSV / XLSX / HTML writers;
* :mod:`msb.audit.curate`: decisions file -> curated ``index.csv``; audit clusters -> ``group``.
"""

from __future__ import annotations

from msb.audit.core import AuditConfig, AuditResult, run_audit
from msb.audit.curate import apply_decisions, cluster_decisions, groups_from_clusters, read_decisions
from msb.audit.report import write_audit

__all__ = ["AuditConfig", "AuditResult", "run_audit", "write_audit", "apply_decisions", "read_decisions",
           "cluster_decisions", "groups_from_clusters"]
