"""``msb data prepare|synth|validate`` and ``msb audit``: the dataset commands."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli_common import app, console, data_app, log, track
from msb.errors import MSBError

__all__ = ["data_prepare", "data_synth", "data_merge", "data_validate", "audit"]


# ------------------------------------------------------------------------------------------------ data
@data_app.command("prepare")
def data_prepare(name: str = typer.Argument(..., help="Converter: kvasir-seg | pranet | cvc-clinicdb | cvc-colondb | "
                                                      "etis-larib | cvc-300 | isic2018-task1 | busi | "
                                                      "bkai-igh-neopolyp | bcss | folder | synthetic."),
                 source: Optional[str] = typer.Option(None, help="Raw dataset folder, .zip/.tar archive or http(s) "
                                                                 "URL of one (downloaded to a temporary file)."),
                 out: Optional[Path] = typer.Option(None, help="Output folder (default datasets/<name>)."),
                 limit: Optional[int] = typer.Option(None, help="Convert only the first N samples (tests)."),
                 overwrite: bool = typer.Option(False, help="Replace an existing prepared dataset."),
                 threshold: Optional[float] = typer.Option(None, help="Binarise masks: value > T -> foreground "
                                                                      "(e.g. 127)."),
                 groups: Optional[Path] = typer.Option(None, help="CSV of group ids (patient / video sequence)."),
                 group_id_column: Optional[str] = typer.Option(None, help="Its sample key column (default "
                                                                          "sample_id, else image), e.g. frame."),
                 group_column: Optional[str] = typer.Option(None, help="Its group column (default group), e.g. "
                                                                       "sequence."),
                 option: Optional[List[str]] = typer.Option(None, help="Converter option KEY=VALUE (YAML value), "
                                                                       "repeatable, e.g. --option val_fraction=0.")
                 ) -> None:
    """Convert a raw dataset into the prepared layout (index.csv + classes.csv)."""
    import yaml

    from msb.data.converters.fetch import prepare_from_source

    out = out or Path("datasets") / name.replace("-", "_")
    opts = {"overwrite": overwrite}
    if limit is not None:
        opts["limit"] = limit
    if threshold is not None:
        opts["threshold"] = threshold
    if groups is not None:
        opts["groups_csv"] = str(groups)
    elif group_id_column is not None or group_column is not None:
        raise MSBError("--group-id-column / --group-column name the columns of --groups FILE; pass --groups too.")
    if group_id_column is not None:
        opts["group_id_column"] = group_id_column
    if group_column is not None:
        opts["group_column"] = group_column
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise MSBError(f"--option {item!r}: expected KEY=VALUE, e.g. --option threshold=127.")
        opts[key.strip()] = yaml.safe_load(value)
    report = prepare_from_source(name, source, out, **opts)
    log(report.summary())


@data_app.command("synth")
def data_synth(out: Path = typer.Option(Path("datasets/synthetic"), help="Output folder."),
               n: int = typer.Option(120, help="Number of images."),
               seed: int = typer.Option(0, help="Random seed."),
               overwrite: bool = typer.Option(False, help="Replace an existing dataset at --out.")) -> None:
    """Write the small deterministic synthetic dataset (no download needed)."""
    from msb.data.synth import make_synthetic_dataset

    if n < 1:
        raise MSBError(f"--n must be a positive number of images, got {n}")
    log(make_synthetic_dataset(out, n_samples=n, seed=seed, overwrite=overwrite).summary())


@data_app.command("merge")
def data_merge(out: Path = typer.Argument(..., help="Output folder of the merged dataset."),
               part: List[str] = typer.Option(..., help="NAME=DIR: a prepared dataset folder and its source label "
                                                        "(the 'source' column), repeatable (at least two)."),
               limit: Optional[List[str]] = typer.Option(None, help="NAME=N: keep a seeded, group-aware subset of "
                                                                    "about N samples of that part (whole groups)."),
               seed: int = typer.Option(0, help="Seed of the subsets."),
               keep_splits: bool = typer.Option(False, help="Keep the parts' split columns (default: empty)."),
               overwrite: bool = typer.Option(False, help="Replace an existing dataset at OUT.")) -> None:
    """Merge prepared datasets with the same classes into one multi-source dataset (source = part name)."""
    from msb.data.converters import prepare_dataset

    parts, limits = [], {}
    for item in limit or []:
        name, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit():
            raise MSBError(f"--limit {item!r}: expected NAME=N, e.g. --limit kvasir=160.")
        limits[name.strip()] = int(n)
    for item in part:
        name, sep, folder = item.partition("=")
        if not sep or not name.strip() or not folder.strip():
            raise MSBError(f"--part {item!r}: expected NAME=DIR, e.g. --part kvasir=datasets/kvasir_seg.")
        parts.append({"name": name.strip(), "root": folder.strip(),
                      **({"limit": limits.pop(name.strip())} if name.strip() in limits else {})})
    if limits:
        raise MSBError(f"--limit names {sorted(limits)}, which are not --part names")
    log(prepare_dataset("merge", None, out, parts=parts, seed=seed, keep_splits=keep_splits,
                        overwrite=overwrite).summary())


@data_app.command("validate")
def data_validate(root: Path = typer.Argument(..., help="Prepared dataset folder.")) -> None:
    """Validate a prepared dataset fully: files and sizes, then every image and mask file decoded (damaged or
    truncated files refused) and every mask value checked against classes.csv at native resolution."""
    from msb.data.schema import load_prepared_dataset
    from msb.data.verify import verify_files

    ds = load_prepared_dataset(root)
    verify_files(ds, track=track, use_record=False)
    log(f"{root}: {len(ds.index)} samples, {len(ds.foreground_classes)} foreground class(es): OK")


# ----------------------------------------------------------------------------------------------- audit
@app.command()
def audit(dataset: Path = typer.Argument(..., help="Prepared dataset folder."),
          against: Optional[Path] = typer.Option(None, help="Second prepared dataset: audit across the two."),
          out: Optional[Path] = typer.Option(None, help="Audit folder (default <dataset>/audit[_vs_<other>])."),
          hamming_k: int = typer.Option(8, help="Candidate pair: pHash or dHash Hamming distance <= k (of 64 bits)."),
          screens: bool = typer.Option(True, help="Pixel screens (NCC, SSIM) on candidate pairs."),
          screen_size: int = typer.Option(64, help="Screen thumbnail side in px (grey, INTER_AREA)."),
          ncc_min: Optional[float] = typer.Option(0.95, help="Confirm a candidate when NCC >= this (-1: no check)."),
          ssim_min: Optional[float] = typer.Option(None, help="Also require SSIM >= this."),
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
          overwrite: bool = typer.Option(False, help="Replace an existing curated dataset folder.")) -> None:
    """Duplicate and leakage audit: identical bytes, pHash/dHash near-duplicates, cross-split census, reports."""
    from msb.audit.core import AuditConfig
    from msb.audit.pipeline import audit_dataset

    cfg = AuditConfig(hamming_k=hamming_k, screens=screens, screen_size=screen_size, ncc_min=ncc_min,
                      ssim_min=ssim_min, workers=workers)
    res = audit_dataset(dataset, against=against, out=out, config=cfg, split_file=split_file, apply=apply,
                        apply_clusters=apply_clusters, curated_out=curated_out, overwrite=overwrite,
                        max_sheet_pairs=max_sheet_pairs, progress=track)
    if res.result is not None:
        from msb.audit.census import summary_table

        r = res.result
        summ = summary_table(r.census)
        table = Table(title=f"cross-{r.boundary} census: count / denominator ({r.params['n_rows']} rows, "
                            f"{r.params['n_candidate_pairs']} candidate pairs; units in census.csv)")
        for col in summ.columns:
            table.add_column(col, justify="left" if col == "relation" else "right")
        for row in summ.itertuples(index=False):
            table.add_row(*[str(v) for v in row])
        console.print(table)
        if r.params["n_unassigned_rows"]:
            log(f"{r.params['n_unassigned_rows']} of {r.params['n_rows']} rows have no {r.boundary}: they cannot "
                f"cross; pass --split-file (e.g. a run's split.csv) to audit a concrete split")
        log(f"audit written to {res.written[0].parent} ({', '.join(p.name for p in res.written)})")
    if res.curation is not None:
        log(res.curation.summary())
