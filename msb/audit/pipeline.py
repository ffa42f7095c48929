"""``msb audit`` as one function: audit -> reports -> (optionally) curated dataset.

Modes:

* audit only (default): :func:`msb.audit.core.run_audit` + :func:`msb.audit.report.write_audit` into ``out``
  (default ``<dataset>/audit``, or ``<dataset>/audit_vs_<other>`` with ``against``);
* ``apply`` only (a decisions CSV, no ``apply_clusters``): no audit is run; the decisions are applied
  (:func:`msb.audit.curate.apply_decisions`);
* ``apply_clusters``: audit, then every near-duplicate cluster becomes a group in a curated dataset, except that a
  cluster is cut at its cross-group links (confirmed pairs of two different groups) unless the decisions file
  accepts the link (:func:`msb.audit.curate.accepted_links`). A decisions file given with it takes precedence
  for the samples it names; the combined decisions are written to ``<out>/decisions_applied.csv`` (the file
  recorded in ``curation.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence


from msb.audit.calibration import judged
from msb.audit.core import AuditConfig, AuditResult, run_audit
from msb.audit.curate import (CurationReport, accepted_links, apply_decisions, cluster_decisions, combine_decisions,
                              read_decisions)
from msb.audit.report import write_audit
from msb.audit.verdict import parse_checks
from msb.data.schema import load_prepared_dataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text


@dataclass
class AuditOutcome:
    """What :func:`audit_dataset` did: the audit (or None), the files written, the curation (or None)."""

    result: AuditResult | None = None
    written: list[Path] = field(default_factory=list)
    curation: CurationReport | None = None


def default_out(dataset: str | Path, against: str | Path | None) -> Path:
    """``<dataset>/audit`` or ``<dataset>/audit_vs_<other folder name>``."""
    root = Path(dataset).expanduser()
    return root / ("audit" if against is None else f"audit_vs_{Path(against).expanduser().resolve().name}")


def audit_dataset(dataset: str | Path, *, against: str | Path | None = None, out: str | Path | None = None,
                  config: AuditConfig | None = None, split_file: str | Path | None = None,
                  apply: str | Path | None = None, apply_clusters: bool = False,
                  curated_out: str | Path | None = None, overwrite: bool = False, max_sheet_pairs: int = 300,
                  fail_on: Sequence[str] = (),
                  progress: Callable[[Iterable, str, int], Iterator] | None = None) -> AuditOutcome:
    """Run the ``msb audit`` modes described in the module docstring.

    ``fail_on``: verdict checks (:mod:`msb.audit.verdict`); the verdict is stored in ``result.verdict`` and
    written to ``<out>/verdict.json`` (this function does not raise on ``FAIL``; the CLI exits 3).

    Raises:
        MSBError: ``apply``/``apply_clusters`` with ``against`` (curation is per dataset), and every error of
            the called stages.
    """
    if against is not None and (apply is not None or apply_clusters):
        raise MSBError("--apply/--apply-clusters curate one dataset; run them without --against.")
    if apply is not None and not apply_clusters:
        if parse_checks(fail_on):
            raise MSBError("--fail-on judges an audit, and --apply alone runs none; add --apply-clusters or audit "
                           "the curated folder afterwards.")
        return AuditOutcome(curation=apply_decisions(dataset, apply, curated_out, overwrite=overwrite))
    checks = parse_checks(fail_on)  # unknown names fail before the audit runs
    if against is not None and "crossing-group" in checks:
        raise MSBError("--fail-on crossing-group: groups are only audited across the splits of one dataset; "
                       "drop it or audit without --against.")
    result = run_audit(dataset, against=against, split_file=split_file, config=config, progress=progress)
    result.verdict = judged(result, checks)
    out_dir = Path(out) if out is not None else default_out(dataset, against)
    written = write_audit(result, out_dir, max_sheet_pairs=max_sheet_pairs)
    curation = None
    if apply_clusters:
        user = read_decisions(apply, load_prepared_dataset(dataset, check_files=False).sample_ids) \
            if apply is not None else None
        dec = cluster_decisions(result, accepted=accepted_links(user) if user is not None else None)
        if user is not None:
            dec = combine_decisions(dec, user)
        applied = out_dir / "decisions_applied.csv"
        atomic_write_text(applied, dec.to_csv(index=False, lineterminator="\n"))
        written.append(applied)
        curation = apply_decisions(dataset, applied, curated_out, overwrite=overwrite)
    return AuditOutcome(result=result, written=written, curation=curation)


__all__ = ["audit_dataset", "AuditOutcome", "default_out"]
