"""``msb data prepare|synth|validate``: the dataset commands (``msb audit`` is in :mod:`msb.cli.audit`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.common import log, track
from msb.errors import MSBError

app = typer.Typer(no_args_is_help=True, help="Prepare, synthesise and validate datasets.")  # ``msb data``

__all__ = ["data_prepare", "data_synth", "data_merge", "data_validate"]


# ------------------------------------------------------------------------------------------------ data
@app.command("prepare")
def data_prepare(name: str = typer.Argument(..., help="Converter: kvasir-seg | pranet | cvc-clinicdb | cvc-colondb | "
                                                      "etis-larib | cvc-300 | isic2018-task1 | busi | "
                                                      "bkai-igh-neopolyp | bcss | camus | folder | synthetic | "
                                                      "synthetic-pranet."),
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


@app.command("synth")
def data_synth(out: Path = typer.Option(Path("datasets/synthetic"), help="Output folder."),
               n: int = typer.Option(120, help="Number of images."),
               seed: int = typer.Option(0, help="Random seed."),
               overwrite: bool = typer.Option(False, help="Replace an existing dataset at --out.")) -> None:
    """Write the small deterministic synthetic dataset (no download needed)."""
    from msb.data.converters.provenance import recording
    from msb.data.synth import make_synthetic_dataset

    if n < 1:
        raise MSBError(f"--n must be a positive number of images, got {n}")
    with recording("synthetic", None, {"n_samples": n, "seed": seed}):  # -> prepare.json
        log(make_synthetic_dataset(out, n_samples=n, seed=seed, overwrite=overwrite).summary())


@app.command("merge")
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


@app.command("validate")
def data_validate(root: Path = typer.Argument(..., help="Prepared dataset folder.")) -> None:
    """Validate a prepared dataset fully: files and sizes, then every image and mask file decoded (damaged or
    truncated files refused) and every mask value checked against classes.csv at native resolution."""
    from msb.data.converters.provenance import describe
    from msb.data.schema import load_prepared_dataset
    from msb.data.verify import verify_files

    ds = load_prepared_dataset(root)
    verify_files(ds, track=track, use_record=False)
    log(f"{root}: {len(ds.index)} samples, {len(ds.foreground_classes)} foreground class(es): OK")
    for line in describe(root):  # how it was made (prepare.json)
        log(line)
