"""``msb profile --study STUDY_DIR``: the models of a finished study and their accuracy from stored counts.

A study folder ``<run_root>/<study>/`` holds one run folder per run (``<run_id>/config.yaml``); k-fold runs are
sibling run folders of the same model config. This module reads artifacts only (``config.yaml``,
``classes.csv`` of the prepared dataset, ``evaluation/<role>/counts.parquet``): it never imports training code.

Runs with the same model config (:func:`~msb.profiling.measure.model_label`) and class count are profiled once,
at their training input size(s) (``data.input_size``) plus any ``--input-size`` given. Accuracy is re-aggregated
from the counts with :func:`msb.analysis.counts.aggregate.reaggregate`, pooling the count rows of all runs (folds) of
one model on one dataset split and input size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from msb.analysis.counts.aggregate import ALL_RULES, reaggregate
from msb.analysis.counts.counts_io import read_counts
from msb.config.layering import load_yaml
from msb.config.schema import RunConfig
from msb.errors import MSBError
from msb.profiling.measure import ProfileTarget, model_label

__all__ = ["StudyRun", "find_study_runs", "targets_from_study", "study_accuracy", "accuracy_vs_cost"]


@dataclass(frozen=True)
class StudyRun:
    """One run folder of a study: its folder, validated config, table label and class count."""

    run_dir: Path
    config: RunConfig
    label: str
    num_classes: int


def _num_classes(cfg: RunConfig, run_dir: Path, log: Callable[[str], None]) -> int:
    classes_csv = Path(cfg.data.root) / "classes.csv"
    if classes_csv.is_file():
        from msb.data.schema import read_classes

        return max(1, len(read_classes(classes_csv)) - 1)
    for counts in sorted((run_dir / "evaluation").glob("*/counts.parquet")):
        return max(1, int(pd.read_parquet(counts, columns=["class_id"])["class_id"].nunique()))
    log(f"[{run_dir.name}] {classes_csv} not found and no counts: profiling with 1 output class")
    return 1


def find_study_runs(study_dir: str | Path, log: Callable[[str], None] = lambda m: None) -> list[StudyRun]:
    """Run folders (sub-folders holding ``config.yaml``) of ``study_dir``, sorted by name.

    Raises:
        MSBError: the folder does not exist or holds no run folder; a ``config.yaml`` does not validate.
    """
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise MSBError(f"--study {study_dir}: folder not found; give a study folder runs/<study>/")
    runs = []
    for d in sorted(p for p in study_dir.iterdir() if (p / "config.yaml").is_file()):
        try:
            cfg = RunConfig.model_validate(load_yaml(d / "config.yaml"))
        except MSBError:
            raise
        except Exception as exc:  # pydantic ValidationError
            raise MSBError(f"{d / 'config.yaml'}: not a valid run config ({str(exc).splitlines()[0]}); "
                           f"regenerate it with msb generate") from exc
        runs.append(StudyRun(d, cfg, model_label(cfg.model), _num_classes(cfg, d, log)))
    if not runs:
        raise MSBError(f"--study {study_dir}: no run folders (sub-folders with config.yaml) inside; give the "
                       f"study folder runs/<study>/ written by msb run")
    return runs


def targets_from_study(runs: list[StudyRun]) -> list[ProfileTarget]:
    """One :class:`ProfileTarget` per distinct (label, class count), with the runs' training sizes."""
    targets: dict[tuple[str, int], ProfileTarget] = {}
    for r in runs:
        key = (r.label, r.num_classes)
        size = tuple(int(v) for v in r.config.data.input_size)
        if key in targets:
            t = targets[key]
            if size not in t.sizes:
                targets[key] = ProfileTarget(t.label, t.model, t.num_classes, (*t.sizes, size))  # type: ignore[arg-type]
        else:
            targets[key] = ProfileTarget(r.label, r.config.model, r.num_classes, (size,))  # type: ignore[arg-type]
    return list(targets.values())


def study_accuracy(runs: list[StudyRun], role: str = "best", rule: str = "image-macro",
                   metric: str = "dice") -> pd.DataFrame:
    """Accuracy per model x dataset split x training input size from the runs' stored counts.

    Args:
        runs: from :func:`find_study_runs`.
        role: checkpoint role whose counts are read (``evaluation/<role>/counts.parquet``).
        rule: aggregation rule (``global-micro``, ``image-macro``, ``class-macro``).
        metric: ``dice`` (default) or ``iou``/``precision``/``recall``.

    Returns:
        DataFrame ``dataset, split, model, input_h, input_w, checkpoint_role, aggregation, metric, value,
        n_images, n_classes, n_units, n_excluded, n_runs`` (value in [0, 1] or NaN when undefined).

    Raises:
        MSBError: no run has counts for ``role``; unknown rule/metric; counts that cannot be pooled.
    """
    if rule not in ALL_RULES:
        raise MSBError(f"--rule must be one of {list(ALL_RULES)}, not '{rule}'")
    files, label_of, size_of = [], {}, {}
    for r in runs:
        p = r.run_dir / "evaluation" / role / "counts.parquet"
        if p.is_file():
            files.append(p)
            label_of[r.run_dir.name] = r.label
            size_of[r.run_dir.name] = tuple(int(v) for v in r.config.data.input_size)
    if not files:
        raise MSBError(f"no run of the study has evaluation/{role}/counts.parquet; evaluate the runs first "
                       f"(msb evaluate RUN_DIR --checkpoint {role}) or pick another --role")
    df = read_counts(files)
    unknown = sorted(set(df["run_id"]) - set(label_of))
    if unknown:
        raise MSBError(f"counts rows name run_id(s) {unknown[:3]} that are not the folder names of the runs "
                       f"read; the counts files were moved or renamed, re-evaluate the runs")
    df["model"] = df["run_id"].map(label_of)
    df["input_h"] = df["run_id"].map(lambda r: size_of[r][0]).astype("int64")
    df["input_w"] = df["run_id"].map(lambda r: size_of[r][1]).astype("int64")
    n_runs = df.groupby(["dataset", "split", "model", "input_h", "input_w"])["run_id"].nunique()
    table = reaggregate(df, group_by=("dataset", "split", "model", "input_h", "input_w", "checkpoint_role"),
                        rules=[rule], metrics=[metric])
    table["n_runs"] = [int(n_runs.loc[(r.dataset, r.split, r.model, r.input_h, r.input_w)])
                       for r in table.itertuples()]
    return table


def accuracy_vs_cost(accuracy: pd.DataFrame, profile: pd.DataFrame, precision: str = "fp32") -> pd.DataFrame:
    """Join accuracy rows with the profile rows of the same model and input size (first batch size and the
    given precision). Returns the accuracy columns plus ``gmacs``, ``params_m``, ``latency_ms_median``,
    ``throughput_ips``; rows without a matching profile are dropped."""
    prof = profile[profile["precision"] == precision] if (profile["precision"] == precision).any() else profile
    prof = prof.sort_values("batch_size").drop_duplicates(["model", "input_h", "input_w"])
    cols = ["model", "input_h", "input_w", "gmacs", "params_m", "latency_ms_median", "throughput_ips"]
    return accuracy.merge(prof[cols], on=["model", "input_h", "input_w"], how="inner")
