"""The benchmark contract and the reporting checklist of a study, read from its run folders only.

Each run folder (``docs/design.md``) holds ``config.yaml`` (the resolved run config), ``split.csv``,
``manifest.json``, ``checkpoints/records.json`` and ``train_log.csv``. :func:`contract_table` lays the
settings a reader needs to reproduce or judge a benchmark side by side (dataset, split policy,
preprocessing, model, optimisation and checkpoint policy, decision rule, aggregation);
:func:`reporting_checklist` says, for this study, whether HD95 and recall are reported, the split protocol is
stated, an external test set exists and significance was tested, each item pass/fail with its evidence.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from msb.errors import MSBError
from msb.utils.epochs import normalise_records

__all__ = ["RunInfo", "ChecklistItem", "find_run_dirs", "find_counts_files", "read_run", "contract_table",
           "reporting_checklist",
           "resolve_data_root", "CONTRACT_SECTIONS"]

#: Contract sections: title -> config key prefixes (dotted) shown in it.
CONTRACT_SECTIONS: dict[str, tuple[str, ...]] = {
    "Dataset": ("data.name", "data.root", "data.prepare.converter", "data.prepare.source"),
    "Split policy": ("data.split.", "evaluation.split", "data.max_samples_per_split"),
    "Preprocessing": ("data.input_size", "data.normalize_mean", "data.normalize_std", "train.augment."),
    "Model settings": ("model.",),
    "Optimisation": ("train.epochs", "train.batch_size", "train.optimizer.", "train.scheduler.", "train.loss.",
                     "train.grad_clip.", "train.early_stopping", "train.amp", "train.precision", "random_seed", "full_determinism"),
    "Checkpoint policy": ("checkpoint.", "evaluation.checkpoint"),
    "Decision rule": ("evaluation.threshold", "evaluation.threshold_on"),
}


@dataclass(frozen=True)
class RunInfo:
    """What the report needs from one run folder.

    Attributes:
        run_dir: the folder; run_id: its name; config: the parsed ``config.yaml`` (dict);
        split: ``split.csv`` (``sample_id, split``) or None; manifest: ``manifest.json`` or {};
        records: ``checkpoints/records.json`` (epochs 1-based, old 0-based files converted) or {};
        train_log: ``train_log.csv`` or None;
        problems: files that were missing or unreadable (shown as evidence).
    """

    run_dir: Path
    run_id: str
    config: dict
    split: pd.DataFrame | None
    manifest: dict
    records: dict
    train_log: pd.DataFrame | None
    problems: tuple[str, ...] = field(default=())


def find_run_dirs(study_dir: str | Path, exclude: Sequence[Path] = ()) -> list[Path]:
    """Run folders (folders holding ``config.yaml``) at any depth below ``study_dir``, sorted; folders whose
    relative path has a part starting with ``.`` and those under ``exclude`` are skipped.

    Raises:
        MSBError: the folder does not exist or holds no run folder.
    """
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise MSBError(f"{study_dir}: study folder not found; give runs/<study>")
    runs = [p.parent for p in sorted(study_dir.rglob("config.yaml")) if _visible(p, study_dir, exclude)]
    if not runs:
        raise MSBError(f"{study_dir}: no run folder (a sub-folder with config.yaml) found; give the study "
                       f"folder runs/<study> written by `msb run`")
    return runs


def _visible(path: Path, root: Path, exclude: Sequence[Path]) -> bool:
    rel = path.relative_to(root)
    if any(part.startswith(".") for part in rel.parts):
        return False
    rp = path.resolve()
    return not any(rp.is_relative_to(Path(e).resolve()) for e in exclude)


def find_counts_files(study_dir: str | Path, exclude: Sequence[Path] = ()) -> list[Path]:
    """Every ``counts.parquet`` below ``study_dir`` (hidden folders, ``exclude`` and the selection-split evaluations
    ``evaluation/selection/`` of the threshold analysis skipped, as
    :func:`msb.analysis.counts.counts_files.find_counts_files`), sorted."""
    from msb.analysis.counts.counts_files import in_selection_eval

    study_dir = Path(study_dir)
    return [p for p in sorted(study_dir.rglob("counts.parquet"))
            if _visible(p, study_dir, exclude) and not in_selection_eval(p, study_dir)]


def read_run(run_dir: str | Path) -> RunInfo:
    """Read the metadata files of one run folder; missing optional files are recorded in ``problems``.

    Raises:
        MSBError: ``config.yaml`` missing or not a YAML mapping.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise MSBError(f"{cfg_path}: cannot read the run config ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise MSBError(f"{cfg_path}: not a YAML mapping; the run folder is damaged, re-run `msb generate`")
    problems = []

    def _json(path: Path) -> dict:
        if not path.is_file():
            problems.append(f"{path.relative_to(run_dir)} missing")
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, json.JSONDecodeError) as e:
            problems.append(f"{path.relative_to(run_dir)} unreadable ({e})")
            return {}

    def _csv(name: str) -> pd.DataFrame | None:
        p = run_dir / name
        if not p.is_file():
            problems.append(f"{name} missing")
            return None
        try:
            return pd.read_csv(p, dtype={"sample_id": str, "split": str} if name == "split.csv" else None)
        except Exception as e:  # pandas parser errors
            problems.append(f"{name} unreadable ({type(e).__name__})")
            return None

    split, manifest = _csv("split.csv"), _json(run_dir / "manifest.json")
    records_path = run_dir / "checkpoints" / "records.json"
    records = _json(records_path)
    try:  # 1-based epochs, as train_log.csv; old 0-based records are converted
        records = normalise_records(records, records_path)
    except MSBError as e:
        problems.append(f"{records_path.relative_to(run_dir)} unreadable ({e})")
        records = {}
    return RunInfo(run_dir, run_dir.name, config, split, manifest, records, _csv("train_log.csv"), tuple(problems))


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _show(v: object) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    if v is None:
        return "none"
    return str(v)


def _in_section(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or (p.endswith(".") and key.startswith(p)) or key.startswith(p + ".") for p in prefixes)


def contract_table(runs: Sequence[RunInfo], labels: dict[str, str] | None = None,
                   extra: dict[str, list[tuple[str, str]]] | None = None) -> pd.DataFrame:
    """The benchmark contract as a table.

    Args:
        runs: the study's runs.
        labels: run_id -> display label (default the run id).
        extra: section -> ``(field, value)`` rows added by the caller (e.g. counts-derived facts, the
            aggregation rules and tests used).

    Returns:
        DataFrame ``section, field, value``: one row per config key of the section; ``value`` is the common
        value, or ``"<label>: <value>; ..."`` when runs differ. Sections in :data:`CONTRACT_SECTIONS` order,
        then the ``extra`` sections.
    """
    labels = labels or {}
    flat = {r.run_id: _flatten(r.config) for r in runs}
    rows = []
    for section, prefixes in CONTRACT_SECTIONS.items():
        found = list(dict.fromkeys(k for f in flat.values() for k in f if _in_section(k, prefixes)))
        keys = sorted(found, key=lambda k: next(i for i, p in enumerate(prefixes) if _in_section(k, [p])))
        for k in keys:
            vals = {rid: _show(f.get(k, "(absent)")) for rid, f in flat.items()}
            uniq = set(vals.values())
            value = next(iter(uniq)) if len(uniq) == 1 else "; ".join(
                f"{labels.get(rid, rid)}: {v}" for rid, v in vals.items())
            rows.append({"section": section, "field": k, "value": value})
        if section == "Split policy":
            for r in runs:
                if r.split is not None and "split" in r.split.columns:
                    counts = r.split["split"].value_counts()
                    text = ", ".join(f"{s}={int(counts[s])}" for s in sorted(counts.index))
                    rows.append({"section": section, "field": f"split.csv ({labels.get(r.run_id, r.run_id)})",
                                 "value": text + f"; sha256 {str(r.manifest.get('split_sha256', 'n/a'))[:16]}"})
        if section == "Checkpoint policy":
            for r in runs:
                for role, rec in sorted(r.records.items()):
                    if isinstance(rec, dict):
                        rows.append({"section": section,
                                     "field": f"{role} checkpoint ({labels.get(r.run_id, r.run_id)})",
                                     "value": f"epoch {rec.get('epoch')}, {rec.get('metric')} = "
                                              f"{rec.get('value')} on '{rec.get('selection_split')}'"})
    for section, items in (extra or {}).items():
        rows.extend({"section": section, "field": f, "value": v} for f, v in items)
    return pd.DataFrame(rows, columns=["section", "field", "value"])


def resolve_data_root(run: RunInfo) -> Path | None:
    """The run's prepared dataset folder (``data.root`` holding ``index.csv``): absolute as given, else
    relative to the working directory, else relative to a folder above the run. None when not found."""
    root = (run.config.get("data") or {}).get("root")
    if not root:
        return None
    p = Path(str(root))
    cands = [p] if p.is_absolute() else [Path.cwd() / p, *(q / p for q in run.run_dir.resolve().parents)]
    for c in cands:
        if (c / "index.csv").is_file():
            return c
    return None


@dataclass(frozen=True)
class ChecklistItem:
    """One reporting-checklist item: ``item`` (what is checked), ``passed``, ``evidence`` (why);
    ``applicable`` False when the item cannot be checked on this study (e.g. every paired difference is zero):
    then it is neither a PASS nor a FAIL of the study (:attr:`status` ``"N/A"``)."""

    item: str
    passed: bool
    evidence: str
    applicable: bool = True

    @property
    def status(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"N/A"`` (not applicable / not testable)."""
        return "N/A" if not self.applicable else ("PASS" if self.passed else "FAIL")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def reporting_checklist(runs: Sequence[RunInfo], counts: pd.DataFrame, scores: pd.DataFrame,
                        metrics: pd.DataFrame | None, n_significance_tests: int,
                        n_systems: int, n_boot: int, zero_pairs: Sequence[tuple[str, int]] = ()
                        ) -> list[ChecklistItem]:
    """Evaluate the reporting checklist of a study.

    Args:
        runs: the study's runs; counts: their counts rows; scores: the tidy score table of the report
            (``metric`` column); metrics: the concatenated ``metrics.parquet`` rows (or None);
        n_significance_tests: paired tests computed; n_systems: systems compared; n_boot: bootstrap replicates
            (0 = no CIs).
        zero_pairs: ``(pair label, N)`` of the pairs whose N paired per-image differences are all zero
            (identical systems): with no test computed, significance is "not testable" (N/A), not a FAIL.

    Returns:
        Items in order: HD95 reported, recall reported, split protocol stated, external test set, significance
        tested, uncertainty (CIs) reported, checkpoint selected without the test split (``recipe: official``
        may select on it).
    """
    items = []
    run_ids = sorted(set(counts["run_id"].astype(str)))
    # HD95
    if metrics is not None and "hd95" in metrics.columns and len(metrics):
        have = sorted(set(metrics.loc[metrics["hd95"].notna(), "run_id"].astype(str)))
        conv = sorted(set(metrics["hd_convention"].astype(str))) if "hd_convention" in metrics.columns else []
        missing = [r for r in run_ids if r not in have]
        items.append(ChecklistItem(
            "HD95 reported", not missing,
            f"metrics.parquet with defined hd95 for {len(have)}/{len(run_ids)} run(s), convention {conv}"
            + (f"; missing for {missing}" if missing else "")))
    else:
        items.append(ChecklistItem("HD95 reported", False,
                                   "no metrics.parquet with an hd95 column beside the counts; "
                                   "run `msb metrics RUN_DIR`"))
    # recall
    rec = scores[scores["metric"] == "recall"] if "metric" in scores.columns else scores.iloc[0:0]
    ok = len(rec) > 0 and rec["value"].notna().any()
    items.append(ChecklistItem(
        "Recall reported", bool(ok),
        (f"recall under {sorted(set(rec['aggregation']))} in the score table ({int(rec['value'].notna().sum())} "
         f"defined values)") if ok else "no defined recall value in the score table"))
    # split protocol
    missing = []
    stated = []
    for r in runs:
        split_cfg = (r.config.get("data") or {}).get("split") or {}
        p = r.run_dir / "split.csv"
        sha = r.manifest.get("split_sha256")
        if not p.is_file():
            missing.append(f"{r.run_id}: split.csv missing")
        elif not split_cfg.get("mode"):
            missing.append(f"{r.run_id}: data.split.mode not in config.yaml")
        elif sha is not None and sha != _sha256(p):
            missing.append(f"{r.run_id}: split.csv differs from the SHA-256 in manifest.json")
        else:
            stated.append(f"{split_cfg.get('mode')} (seed {split_cfg.get('seed')}, "
                          f"val {split_cfg.get('val_fraction')}, "
                          f"test {split_cfg.get('test_fraction')}, groups '{split_cfg.get('group_column')}')")
    items.append(ChecklistItem(
        "Split protocol stated", not missing,
        ("; ".join(missing) if missing else
         f"split.csv + data.split in every run ({len(runs)}): " + "; ".join(sorted(set(stated))))))
    # external test set
    ext_evidence, ext = [], False
    for r in runs:
        trained_on = str((r.config.get("data") or {}).get("name", ""))
        rows = counts[counts["run_id"].astype(str) == r.run_id]
        evaluated = sorted(set(rows["dataset"].astype(str)))
        other = [d for d in evaluated if d != trained_on]
        if other:
            ext = True
            ext_evidence.append(f"{r.run_id}: trained on '{trained_on}', evaluated on {other}")
            continue
        root = resolve_data_root(r)
        if root is None or r.split is None:
            ext_evidence.append(f"{r.run_id}: dataset folder not found, training sources unknown")
            continue
        try:
            index = pd.read_csv(root / "index.csv", dtype=str, keep_default_na=False)
        except Exception:  # pandas parser errors
            ext_evidence.append(f"{r.run_id}: {root / 'index.csv'} unreadable")
            continue
        train_ids = set(r.split.loc[r.split["split"] == "train", "sample_id"].astype(str))
        train_src = sorted(set(index.loc[index["sample_id"].isin(train_ids), "source"].astype(str)))
        test_src = sorted(set(rows["source"].astype(str)))
        unseen = [s for s in test_src if s not in train_src]
        if unseen:
            ext = True
            ext_evidence.append(f"{r.run_id}: test sources {unseen} not among training sources {train_src}")
        else:
            ext_evidence.append(f"{r.run_id}: test sources {test_src} all among training sources {train_src} "
                                f"(internal split only)")
    items.append(ChecklistItem("External test set", ext, "; ".join(ext_evidence)))
    # significance
    if n_significance_tests:
        items.append(ChecklistItem(
            "Significance tested", True, f"{n_significance_tests} paired Wilcoxon signed-rank test(s) between "
                                         f"{n_systems} systems, Benjamini-Hochberg adjusted"))
    elif zero_pairs:
        items.append(ChecklistItem(
            "Significance tested", False, "; ".join(f"not testable: all {n} paired differences are zero ({pair})"
                                                    for pair, n in zero_pairs), applicable=False))
    elif n_systems < 2:
        items.append(ChecklistItem("Significance tested", False,
                                   f"not applicable: {n_systems} system(s), nothing to compare", applicable=False))
    else:
        items.append(ChecklistItem("Significance tested", False,
                                   f"{n_systems} systems but no pair of systems on the same images to test"))
    items.append(ChecklistItem(
        "Uncertainty (confidence intervals) reported", n_boot > 0,
        f"image-level percentile bootstrap, {n_boot} replicates" if n_boot > 0
        else "bootstrap disabled (0 replicates)"))
    items.append(_test_selection_item(runs, counts))
    return items


def _scored_splits(r: RunInfo, counts: pd.DataFrame | None) -> dict[str, set[str]]:
    """Checkpoint role -> splits of the run's own dataset it was scored on: from the ``counts`` rows of the run
    (``split_policy`` ``external-only`` rows left out) and from ``evaluation/<role>/counts.parquet`` in its folder
    (``evaluation/external/`` left out: another dataset's split is not this run's split)."""
    out: dict[str, set[str]] = {}
    frames = []
    if counts is not None and {"run_id", "split", "checkpoint_role"} <= set(counts.columns):
        rows = counts[counts["run_id"].astype(str) == r.run_id]
        if "split_policy" in rows.columns:
            rows = rows[rows["split_policy"].astype(str) != "external-only"]
        frames.append(rows[["checkpoint_role", "split"]])
    ev = r.run_dir / "evaluation"
    for p in sorted(ev.glob("*/counts.parquet")) if ev.is_dir() else []:
        try:
            df = pd.read_parquet(p, columns=["split"])
        except Exception:  # noqa: BLE001 - an unreadable file is reported by the counts reader, not here
            continue
        frames.append(pd.DataFrame({"checkpoint_role": p.parent.name, "split": df["split"]}))
    for f in frames:
        for role, split in set(zip(f["checkpoint_role"].astype(str), f["split"].astype(str))):
            out.setdefault(role, set()).add(split.strip().lower())
    return out


def _test_selection_item(runs: Sequence[RunInfo], counts: pd.DataFrame | None = None) -> ChecklistItem:
    """The item "Checkpoint selected without the test split": FAIL when a run selected a checkpoint on the split named
    ``test`` (only ``recipe: official`` allows it, to reproduce official scripts that do; the evidence names those
    runs and their recipe), or when a run's selected checkpoint (any role but ``latest``) was scored on the very
    split it was selected on (its ``records.json`` ``selection_split`` equals a split of its counts rows, e.g.
    out-of-fold predictions on ``val`` with ``best`` selected on ``val``; docs/studies.md ``inner_val``).

    Runs without counts (search trials) are checked for the ``test`` selection only: they are not scored.

    Args:
        runs: the study's runs (every run folder below the study folder, trials included).
        counts: the study's counts rows (``run_id``, ``split``, ``checkpoint_role``, ``split_policy``), or None:
            then only each run's ``evaluation/<role>/counts.parquet`` is read.

    Returns:
        The checklist item, with the offending runs named in its evidence.
    """
    on_test, on_scored = [], []
    for r in runs:
        scored = _scored_splits(r, counts)
        for role, rec in sorted(r.records.items()):
            if not isinstance(rec, dict):
                continue
            sel = str(rec.get("selection_split", "")).strip().lower()
            if sel == "test":
                on_test.append(f"{r.run_id} ({role}, recipe: {r.config.get('recipe', 'controlled')})")
            elif role != "latest" and sel and sel in scored.get(role, set()):
                on_scored.append(f"{r.run_id} ({role} selected on '{sel}' and scored on '{sel}')")
    problems = []
    if on_test:
        problems.append("selected ON THE TEST SPLIT (scores on it are optimistic): " + "; ".join(on_test))
    if on_scored:
        problems.append("selected ON THE SPLIT IT IS SCORED ON (scores are optimistic; use "
                        "cross_validation.inner_val or final.checkpoint: latest): " + "; ".join(on_scored))
    return ChecklistItem(
        "Checkpoint selected without the test split", not problems,
        " | ".join(problems) if problems
        else f"every recorded checkpoint of {len(runs)} run(s) selected on a split other than 'test' and other "
             f"than the split it was scored on")
