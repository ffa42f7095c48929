"""``msb audit``: duplicate and leakage audit with a verdict (exit 3 when a ``--fail-on`` check fails)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log, status_track

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`

__all__ = ["audit", "census_numbers"]


@app.command()
def audit(dataset: Path = typer.Argument(..., help="Prepared dataset folder."),
          against: Optional[Path] = typer.Option(None, help="Second prepared dataset: audit across the two."),
          out: Optional[Path] = typer.Option(None, help="Audit folder (default <dataset>/audit[_vs_<other>])."),
          fail_on: Optional[List[str]] = typer.Option(None, "--fail-on", help="Exit 3 when this relation crosses "
                                                      "the boundary: crossing-identical | crossing-near-duplicate "
                                                      "| crossing-group (repeatable or comma list)."),
          candidates: str = typer.Option("auto", help="Candidate pairs: all (NCC of every pair: stated recall) | "
                                                      "hash (pHash/dHash prefilter) | auto (all up to 20,000 "
                                                      "rows, hash above)."),
          recall_sample: int = typer.Option(1000, help="With hash candidates: measure their recall by comparing "
                                                       "this many random rows with every row by NCC (0: off)."),
          counterpart: str = typer.Option("both", help="Counterpart rule for evaluation rows: first (identical > "
                                                       "near-duplicate > same-group, the first that matches) | "
                                                       "any | both."),
          group_pattern: Optional[str] = typer.Option(None, help="REGEX on the image file name; its first capture "
                                                                 "group is the source/video id (instead of the "
                                                                 "group column)."),
          hamming_k: int = typer.Option(8, help="Candidate pair: pHash or dHash Hamming distance <= k (of 64 bits)."),
          screens: bool = typer.Option(True, help="Pixel screens (NCC, SSIM) on candidate pairs."),
          screen_size: int = typer.Option(64, help="Screen thumbnail side in px (grey, area mean as INTER_AREA)."),
          ncc_min: Optional[float] = typer.Option(0.95, help="Confirm a candidate when NCC >= this (-1: no check)."),
          ssim_min: Optional[float] = typer.Option(None, help="Also require SSIM >= this."),
          fov: str = typer.Option("auto", help="Screens on the content: auto (leave out what is constant across "
                                                "the images and each image's dark border) | none (whole frame) | "
                                                "MASK.png (non-zero = content)."),
          ncc_floor: Optional[float] = typer.Option(0.85, help="With the frame left out, whole-frame NCC >= "
                                                               "--ncc-min also confirms when the content NCC is >= "
                                                               "this (1: content NCC alone)."),
          calibrate: bool = typer.Option(False, help="Print, per screen, the threshold range that confirms no pair "
                                                     "of two different groups and the within-group pairs it "
                                                     "keeps (calibration.csv has every threshold)."),
          split_file: Optional[Path] = typer.Option(None, help="sample_id,split CSV (e.g. a run's split.csv) "
                                                               "instead of index.csv's split column."),
          workers: int = typer.Option(1, help="Hashing processes / search threads."),
          max_sheet_pairs: int = typer.Option(300, help="Pairs shown on the HTML contact sheet."),
          apply: Optional[Path] = typer.Option(None, help="DECISIONS.csv (sample_id,action,reason,target): write a "
                                                          "curated index.csv; no audit is run unless "
                                                          "--apply-clusters."),
          apply_clusters: bool = typer.Option(False, help="Audit, then write a curated dataset whose groups merge "
                                                          "every near-duplicate cluster."),
          curated_out: Optional[Path] = typer.Option(None, help="Curated dataset folder (default "
                                                                "<parent>/<name>_curated)."),
          overwrite: bool = typer.Option(False, help="Replace an existing curated dataset folder."),
          format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP + " csv / json: the census "
                                               "only, counts and denominators as numbers.")) -> None:
    """Duplicate and leakage audit: identical bytes, near-duplicates, shared groups, cross-split census, counterpart
    rules, verdict (exit 3 with --fail-on when the relation crosses), reports."""
    from msb.audit.core import AuditConfig
    from msb.audit.pipeline import audit_dataset
    from msb.audit.verdict import FAIL_EXIT

    fmt = resolve_format(format)
    log = status_log(fmt)  # stdout carries the tables only unless fmt is table
    cfg = AuditConfig(hamming_k=hamming_k, screens=screens, screen_size=screen_size, ncc_min=ncc_min,
                      ssim_min=ssim_min, workers=workers, candidates=candidates, counterpart=counterpart,
                      group_pattern=group_pattern, recall_sample=recall_sample, fov=fov,
                      ncc_floor=None if ncc_floor is not None and ncc_floor >= 1 else ncc_floor)
    res = audit_dataset(dataset, against=against, out=out, config=cfg, split_file=split_file, apply=apply,
                        apply_clusters=apply_clusters, curated_out=curated_out, overwrite=overwrite,
                        max_sheet_pairs=max_sheet_pairs, fail_on=fail_on or (), progress=status_track(fmt))
    if res.result is not None:
        _print_result(res, fmt)
        if calibrate:
            _print_calibration(res, fmt)
    if res.curation is not None:
        log(res.curation.summary())
    if res.result is not None and res.result.verdict is not None:
        for w in res.result.verdict.get("warnings", []):
            log(f"warning: {w}")
        log(res.result.verdict["line"])
        if res.result.verdict["status"] == "FAIL":
            raise typer.Exit(FAIL_EXIT)


def census_numbers(summ):
    """:func:`msb.audit.census.summary_table` with its ``"count / denominator"`` cells split into numbers.

    Args:
        summ: the summary table (``relation`` and one ``"count / denominator"`` string column per quantity;
            ``""`` where the census has no such row).

    Returns:
        DataFrame: ``relation``, then per quantity ``<name>`` (count) and ``<name> denominator``, both nullable
        integers (``<NA>`` for an empty cell).
    """
    import pandas as pd

    out = pd.DataFrame({"relation": summ["relation"]})
    for col in summ.columns[1:]:
        parts = summ[col].astype(str).str.split(" / ", n=1, expand=True).reindex(columns=[0, 1])
        out[col] = pd.to_numeric(parts[0].replace("", None), errors="coerce").astype("Int64")
        out[f"{col} denominator"] = pd.to_numeric(parts[1], errors="coerce").astype("Int64")
    return out


def _print_calibration(res, fmt: str) -> None:
    """``--calibrate``: the predicates side by side and the per-screen ranges of the verdict (one source:
    :func:`msb.audit.calibration.verdict_extras`)."""
    import pandas as pd

    log = status_log(fmt)
    v = res.result.verdict or {}
    pred = v.get("predicate")
    if not pred:
        log("--calibrate: audits across a split only (no groups across datasets)")
        return
    if not pred["rows_with_group"]:
        log("--calibrate: no row has a group (group column or --group-pattern): nothing to calibrate on")
    else:
        cal = pd.DataFrame(pred["calibration"])[["screen", "no_cross_group", "within_kept", "within_candidates"]]
        title = (f"calibration on known groups: default predicate confirms {pred['cross_group_pairs']} of "
                 f"{pred['cross_group_denominator']} cross-group pairs, {pred['within_group_pairs']} of "
                 f"{pred['within_group_denominator']} within-group pairs; per screen alone (calibration.csv)")
        emit_frame(cal, fmt, title, _table(cal, title))
    preds = pd.DataFrame(v.get("predicates", []))
    if len(preds):
        preds = preds.drop(columns=["rule"])
        emit_frame(preds, fmt, "predicates (rules in predicates.csv)", _table(preds, "predicates (rules in "
                                                                             "predicates.csv)"))


def _table(df, title: str) -> Table:
    import pandas as pd

    t = Table(title=title)
    for col in df.columns:
        t.add_column(str(col), justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
    for row in df.itertuples(index=False):
        t.add_row(*[str(x) for x in row])
    return t


def _print_result(res, fmt: str = "table") -> None:
    from msb.audit.census import summary_table

    log = status_log(fmt)
    r = res.result
    summ = summary_table(r.census)
    title = (f"cross-{r.boundary} census: count / denominator ({r.params['n_rows']} rows, "
             f"{r.params['n_candidate_pairs']} candidate pairs; units in census.csv)")
    table = Table(title=title)
    for col in summ.columns:
        table.add_column(col, justify="left" if col == "relation" else "right")
    for row in summ.itertuples(index=False):
        table.add_row(*[str(v) for v in row])
    if fmt in ("csv", "json"):  # pure data: the census only, numbers apart (the counterparts are in counterparts.csv)
        emit_frame(census_numbers(summ), fmt)
    else:
        emit_frame(summ, fmt, title, table)
    if r.counterparts is not None and len(r.counterparts) and fmt in ("csv", "json"):
        log(f"counterparts of evaluation rows: {res.written[0].parent / 'counterparts.csv'}")
    elif r.counterparts is not None and len(r.counterparts):
        from msb.audit.counterparts import rule_summary

        cs = rule_summary(r.counterparts)
        ct = Table(title=f"counterparts of evaluation rows (first · any of denominator; "
                         f"reference side '{r.params['counterparts']['reference_side']}'; counterparts.csv)")
        for col in cs.columns:
            ct.add_column(str(col), justify="left" if col.startswith("relation") else "right")
        for row in cs.itertuples(index=False):
            ct.add_row(*[str(v) for v in row])
        emit_frame(cs, fmt, ct.title, ct)
    if r.params["n_unassigned_rows"]:
        log(f"{r.params['n_unassigned_rows']} of {r.params['n_rows']} rows have no {r.boundary}: they cannot "
            f"cross; pass --split-file (e.g. a run's split.csv) to audit a concrete split")
    fv = r.params.get("fov") or {}
    if fv.get("mode", "none") != "none":
        log(f"screens on the content (--fov {fv['mode']}): {100 * fv['left_out_fraction']:.1f} % of the thumbnail "
            f"pixels left out" + ("; each image also loses its dark border" if fv.get("per_image") else "")
            + "".join(f"; {n}" for n in fv.get("notes", [])))
    log(f"candidates: {r.params['candidate_rule']}; {r.params['seconds']['total']} s")
    rec = r.params.get("prefilter_recall")
    if rec and rec["n_reference_pairs"]:
        k = r.params["config"]["hamming_k"]
        v = rec["by_k"][str(k)] if str(k) in rec["by_k"] else rec["by_k"][k]
        ci = f" (95 % CI {v['ci95'][0]:.1%}-{v['ci95'][1]:.1%})" if "ci95" in v else ""
        log(f"hash prefilter recall at k = {k}: {v['found']} of {rec['n_reference_pairs']} = {v['recall']:.1%}{ci}; "
            f"reference: {rec['reference']}")
    log(f"audit written to {res.written[0].parent} ({', '.join(p.name for p in res.written)})")
