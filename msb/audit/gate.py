"""A clean audit before training (``data.require_audit``): audit the run's actual split, reuse a cached audit of
the same inputs, refuse with one line when a required check fails.

The audit (default :class:`msb.audit.core.AuditConfig`: all-pairs NCC up to 20,000 rows) runs across the split
file the run trains on and is written to ``<cache_root>/<digest[:16]>/`` (the usual audit folder plus the
``digest`` and its inputs in ``verdict.json``). The digest is the SHA-256 of: the dataset's ``index.csv`` bytes,
the split file's bytes, the size and modification time (ns) of every image file, and the audit configuration.
A folder whose ``verdict.json`` holds the same digest is reused (its ``census.csv`` is re-judged with the run's
checks), so the runs of a study that share a split are audited once. A file lock serialises workers that would
audit the same split at the same time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Sequence

import pandas as pd

from msb.audit.core import AuditConfig, run_audit
from msb.audit.calibration import judged
from msb.audit.report import write_audit
from msb.audit.verdict import audit_verdict, parse_checks
from msb.data.schema import load_prepared_dataset
from msb.errors import AuditFailed
from msb.utils.locks import file_lock

#: bump when the audit's output for the same inputs changes (invalidates cached audits)
GATE_VERSION = 2


def audit_digest(dataset_root: str | Path, split_file: str | Path, config: AuditConfig) -> tuple[str, dict]:
    """SHA-256 hex digest of an audit's inputs (module docstring) and the inputs as a JSON-able dict."""
    ds = load_prepared_dataset(dataset_root, check_files=False)
    h = hashlib.sha256()
    index_sha = hashlib.sha256((ds.root / "index.csv").read_bytes()).hexdigest()
    split_sha = hashlib.sha256(Path(split_file).read_bytes()).hexdigest()
    files = hashlib.sha256()
    for p in ds.index["image_path"]:
        st = (ds.root / PurePosixPath(p)).stat()
        files.update(f"{p}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    inputs = {"gate_version": GATE_VERSION, "dataset": str(ds.root), "index_sha256": index_sha,
              "split_file": str(split_file), "split_sha256": split_sha, "image_stats_sha256": files.hexdigest(),
              "config": asdict(config),
              "fov_sha256": (hashlib.sha256(Path(config.fov).expanduser().read_bytes()).hexdigest()
                             if config.fov not in ("auto", "none") else None)}
    h.update(json.dumps({k: v for k, v in inputs.items() if k not in ("dataset", "split_file")},
                        sort_keys=True).encode())
    return h.hexdigest(), inputs


def gated_audit(dataset_root: str | Path, split_file: str | Path, checks: Sequence[str], cache_root: str | Path,
                config: AuditConfig | None = None, log: Callable[[str], None] = lambda m: None
                ) -> tuple[dict[str, Any], Path, bool]:
    """Audit ``dataset_root`` across ``split_file`` (or reuse the cached audit) and judge it with ``checks``.

    Returns:
        ``(verdict, audit folder, reused)``; ``verdict`` is :func:`msb.audit.verdict.audit_verdict` output plus
        ``digest``.

    Raises:
        MSBError: unknown check names, and every error of the audit (bad dataset, unreadable image).
    """
    checks = parse_checks(checks)
    cfg = config or AuditConfig()
    digest, inputs = audit_digest(dataset_root, split_file, cfg)
    folder = Path(cache_root) / digest[:16]
    with file_lock(folder / ".audit.lock"):
        vpath = folder / "verdict.json"
        old = json.loads(vpath.read_text()) if vpath.is_file() else {}
        reused = old.get("digest") == digest and (folder / "census.csv").is_file()
        if reused:
            census = pd.read_csv(folder / "census.csv", keep_default_na=False)
            extras = {k: old[k] for k in ("predicate", "predicates", "group_links", "warnings") if k in old}
            verdict = {**audit_verdict(census, "split", checks), **extras}
        else:
            log(f"audit of {inputs['dataset']} across {split_file} (data.require_audit: {', '.join(checks)}) ...")
            result = run_audit(dataset_root, split_file=split_file, config=cfg)
            verdict = judged(result, checks)
            result.verdict = {**verdict, "digest": digest, "inputs": inputs}
            write_audit(result, folder)  # census.csv first, verdict.json (with the digest) after it
    return {**verdict, "digest": digest}, folder, reused


def require_clean_audit(dataset_root: str | Path, split_file: str | Path, checks: Sequence[str],
                        cache_root: str | Path, config: AuditConfig | None = None,
                        log: Callable[[str], None] = lambda m: None) -> tuple[dict[str, Any], Path]:
    """:func:`gated_audit`, raising when the verdict is ``FAIL``.

    Raises:
        AuditFailed: one line: the failed checks with their counts and denominators, the audit folder and what
            to do.
    """
    verdict, folder, reused = gated_audit(dataset_root, split_file, checks, cache_root, config, log)
    where = f"audit folder {folder}" + (" (cached)" if reused else "")
    if verdict["status"] == "FAIL":
        raise AuditFailed(f"data.require_audit: refusing to train, {verdict['line'].removeprefix('audit verdict: ')}"
                          f"; {where}; split the data by group (data.split.group_column) or curate it "
                          f"(msb audit --apply-clusters) and point data.root at the curated folder.")
    log(f"{verdict['line']}; {where}")
    return verdict, folder


__all__ = ["audit_digest", "gated_audit", "require_clean_audit", "GATE_VERSION"]
