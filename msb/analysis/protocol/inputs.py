"""What the protocol analyses read from a study folder, found once: counts (with their run context), boundary
metrics, prediction folders, profile tables, run folders and recorded exclusions.

Every analysis of :mod:`msb.analysis.protocol` is a pure function of the frames collected here
(:class:`StudyArtifacts`); nothing below reaches back into training code or runs a model.

Context columns (``docs/counts_schema.md``): ``input_size`` (int64, px, the run's ``data.input_size`` height,
-1 unknown), ``split_policy`` (e.g. ``fixed``, ``random(seed=1)``), ``seed`` (training seed), ``variant``
(``key=value;...`` of the study's axes), ``test_time_rule``. Files written before these columns existed get them
from the run folder's ``config.yaml`` (``data.input_size``, ``random_seed``, ``data.split.mode``) or the
"unknown" values (-1, ``"unspecified"``, ``""``: msb.evaluation.counts.PROTOCOL_DEFAULTS).

Added columns (not in counts files): ``eval_dir`` (the counts file's folder), ``eval_kind`` (``internal``:
``evaluation/<role>/``; ``external``: ``evaluation/external/<name>/<role>/``), ``is_ensemble`` (fold-ensemble
rows, ``run_id`` ending in ``-ensemble``), ``architecture`` (:func:`architecture_label`) and
``train_split_policy`` (:func:`training_policies`: the split protocol the row's model was trained under; an
external set's ``external-only`` rows take their model's internal policy), which the protocol checks compare.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import yaml

from msb.analysis.report.contract import RunInfo, find_counts_files, find_run_dirs, read_run
from msb.analysis.counts.counts_io import read_counts
from msb.errors import MSBError
from msb.evaluation.counts import PROTOCOL_DEFAULTS
from msb.utils.evaluation_folder import check_listed_digest

__all__ = ["CONTEXT_DEFAULTS", "StudyArtifacts", "load_study", "with_context", "architecture_label",
           "protocol_family", "split_seed", "check_one_protocol", "annotate_counts", "training_policies",
           "EXTERNAL_ONLY"]

#: The run-context columns and their "unknown" values.
CONTEXT_DEFAULTS: dict[str, object] = dict(PROTOCOL_DEFAULTS)  # one definition: msb.evaluation.counts
_FOLD_TOKEN = re.compile(r"[-_.]?fold[-_]?\d+", re.IGNORECASE)
_HASH_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_ENSEMBLE = re.compile(r"-ensemble\d*$")
_SEED_PARAM = re.compile(r"(^|[(,;\s])seed=(-?\d+)")
#: The ``split_policy`` of an external-set evaluation (msb.evaluation.protocol_context).
EXTERNAL_ONLY = "external-only"


@dataclass
class StudyArtifacts:
    """The stored artifacts of one study (or of the given count files).

    Attributes:
        study_dir: the folder searched.
        counts: counts rows with the context and added columns (module docstring).
        metrics: ``metrics.parquet`` rows of the same evaluations (HD95, NSD, ...), or None when there is none.
        profile: ``profile*.parquet`` rows (:data:`msb.profiling.measure.PROFILE_COLUMNS`) found below the study
            folder, or None.
        runs: run folders (``config.yaml``) by run id.
        excluded: recorded exclusions (``architecture``, ``input_size``, ``reason``) from ``excluded.json`` files
            below ``_study/`` (a list of objects with those keys, or ``{"excluded": [...]}``) and from
            ``_study/exclusions.csv`` (written by ``msb run``), one row per architecture x size, possibly empty.
        notes: what was found missing or read unverified.
    """

    study_dir: Path
    counts: pd.DataFrame
    metrics: pd.DataFrame | None = None
    profile: pd.DataFrame | None = None
    runs: dict[str, RunInfo] = field(default_factory=dict)
    excluded: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["architecture", "input_size",
                                                                                "reason"]))
    notes: list[str] = field(default_factory=list)


def architecture_label(run_id: str, dataset: str = "") -> str:
    """The architecture a run id stands for: ``<dataset>-<arch>-<hash8>[-fold<j>|-ensemble]`` -> ``<arch>``.

    The ``-ensemble`` suffix, a ``fold<j>`` token and a trailing 8-hex config hash are removed, then the
    ``<dataset>-`` prefix (when ``dataset`` is given and the rest is not empty)."""
    name = _ENSEMBLE.sub("", str(run_id))
    name = _HASH_SUFFIX.sub("", _FOLD_TOKEN.sub("", name))
    prefix = f"{dataset}-"
    return name[len(prefix):] if dataset and name.startswith(prefix) and len(name) > len(prefix) else name


def protocol_family(policy: str) -> str:
    """``split_policy`` without its ``seed=`` parameter: ``random(seed=1)`` -> ``random``,
    ``kfold(k=5,seed=0)`` -> ``kfold(k=5)``; the seeds of one random-split protocol are one protocol."""
    p = str(policy)
    m = re.match(r"^([^(]*)\((.*)\)$", p)
    if not m:
        return p
    params = [t for t in (s.strip() for s in m.group(2).split(",")) if t and not t.startswith("seed=")]
    return m.group(1) + (f"({','.join(params)})" if params else "")


def split_seed(policy: str) -> int | None:
    """The ``seed=`` parameter of a ``split_policy`` (``random(seed=1)`` -> 1), None when it has none."""
    m = _SEED_PARAM.search(str(policy))
    return int(m.group(2)) if m else None


def check_one_protocol(df: pd.DataFrame, what: str, allow_mixed: bool = False, family: bool = False) -> None:
    """Refuse to rank or tabulate together rows of different split protocols (``external-only`` rows, the
    external sets evaluated by the study's models, go with any one training protocol).

    Args:
        df: counts rows with ``split_policy``.
        what: the table or ranking named in the message.
        allow_mixed: accept mixed protocols (``allow_mixed_protocols=True`` / ``--allow-mixed-protocols``).
        family: compare :func:`protocol_family` values (the seeds of one random-split protocol are one protocol).

    The compared value is ``train_split_policy`` when present (:func:`training_policies`: an ``external-only``
    row counts under the split protocol its model was trained with, so a model's internal test rows and its
    external rows are one protocol), else ``split_policy``.

    Raises:
        MSBError: one line naming the split policies found.
    """
    if allow_mixed or "split_policy" not in df.columns or len(df) == 0:
        return
    if "train_split_policy" in df.columns:  # external rows carry their model's training protocol
        vals = df["train_split_policy"].astype(str)
    else:  # an external set is evaluated "external-only" by the models of the study's training protocol: beside
        # that one protocol it is not a second one (a P1 table with internal and external test sets is one protocol)
        vals = df["split_policy"].astype(str)
        vals = vals[vals != EXTERNAL_ONLY]
    found = sorted(set(vals.map(protocol_family) if family else vals))
    if len(found) > 1:
        raise MSBError(f"{what}: rows come from different split protocols {found}; numbers from different "
                       f"protocols are not comparable in one column or ranking. Analyse one protocol at a time, "
                       f"or pass allow_mixed_protocols=True (CLI --allow-mixed-protocols) to mix them")


def training_policies(counts: pd.DataFrame) -> pd.Series:
    """The split protocol each row's model was trained under (column ``train_split_policy``).

    An internal row keeps its ``split_policy``. An ``external-only`` row (an external set, docs/counts_schema.md)
    takes the ``split_policy`` of the internal rows of the same ``run_id``; a fold ensemble (``<id>-ensemble``)
    that of its member folds ``<id>-fold<j>`` (one value when they agree, else the sorted values joined by
    ``|``); without internal rows of its model it stays ``external-only``.

    Args:
        counts: rows with ``run_id`` and ``split_policy``.

    Returns:
        A string Series aligned with ``counts``.
    """
    pol = counts["split_policy"].astype(str)
    ext = pol == EXTERNAL_ONLY
    if not ext.any():
        return pol.copy()
    internal = counts.loc[~ext, ["run_id", "split_policy"]].astype(str).drop_duplicates()
    by_run = internal.groupby("run_id")["split_policy"].agg(lambda v: "|".join(sorted(set(v)))).to_dict()
    lookup = {}
    for rid in counts.loc[ext, "run_id"].astype(str).unique():
        if rid in by_run:
            lookup[rid] = by_run[rid]
            continue
        base = _ENSEMBLE.sub("", rid) if _ENSEMBLE.search(rid) else None
        members = sorted({v for r, v in by_run.items() if base and _FOLD_TOKEN.sub("", r) == base
                          and r != base}) if base else []
        lookup[rid] = "|".join(members) if members else EXTERNAL_ONLY
    out = pol.copy()
    out[ext] = counts.loc[ext, "run_id"].astype(str).map(lookup)
    return out


def _run_folder(eval_dir: Path, study_dir: Path) -> Path | None:
    for p in [eval_dir, *eval_dir.parents]:
        if p == study_dir.parent:
            break
        if p.name == "evaluation":
            return p.parent
    return None


def _config_of(run_dir: Path | None, cache: dict) -> dict:
    """The run config of a run folder; an ensemble folder (no config.yaml) takes its first fold's."""
    if run_dir is None:
        return {}
    if run_dir in cache:
        return cache[run_dir]
    cands = [run_dir / "config.yaml"]
    if run_dir.name.endswith("-ensemble"):
        base = run_dir.name[: -len("-ensemble")]
        cands += sorted(run_dir.parent.glob(f"{base}-fold*/config.yaml")) + [run_dir.parent / base / "config.yaml"]
    cfg: dict = {}
    for c in cands:
        if c.is_file():
            try:
                loaded = yaml.safe_load(c.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError):
                continue
            if isinstance(loaded, dict):
                cfg = loaded
                break
    cache[run_dir] = cfg
    return cfg


def _fallback_context(cfg: dict) -> dict[str, object]:
    data = cfg.get("data") or {}
    size = data.get("input_size")
    split = data.get("split") or {}
    out: dict[str, object] = {}
    if isinstance(size, (list, tuple)) and size:
        out["input_size"] = int(size[0])
    elif isinstance(size, int):
        out["input_size"] = size
    if "random_seed" in cfg:
        out["seed"] = int(cfg["random_seed"])
    if split.get("mode"):
        mode = str(split["mode"])
        out["split_policy"] = f"{mode}(seed={split['seed']})" if mode == "random" and "seed" in split else mode
    return out


def with_context(df: pd.DataFrame, config: dict | None = None) -> pd.DataFrame:
    """Add missing context columns (:data:`CONTEXT_DEFAULTS`), from ``config`` (a run config) where it says,
    else the unknown values; existing columns are kept. Returns a copy with int64/str dtypes."""
    out = df.copy()
    fb = _fallback_context(config or {})
    for col, default in CONTEXT_DEFAULTS.items():
        if col not in out.columns:
            out[col] = fb.get(col, default)
        elif col in fb:  # a version-1 counts file reads as unknown (-1 / "unspecified"): the config says
            unknown = out[col].isin([default, "unknown"])
            if unknown.any():
                out.loc[unknown, col] = fb[col]
    out["input_size"] = out["input_size"].astype(np.int64)
    out["seed"] = out["seed"].astype(np.int64)
    for col in ("split_policy", "variant", "test_time_rule"):
        out[col] = out[col].astype(str)
    return out


def _add_labels(df: pd.DataFrame, train_dataset: str) -> pd.DataFrame:
    df["is_ensemble"] = df["run_id"].astype(str).str.endswith("-ensemble")
    arch = []
    for rid, variant in zip(df["run_id"].astype(str), df["variant"].astype(str)):
        kv = dict(t.split("=", 1) for t in variant.split(";") if "=" in t)
        arch.append(kv.get("architecture") or kv.get("arch") or architecture_label(rid, train_dataset))
    df["architecture"] = arch
    return df


def annotate_counts(df: pd.DataFrame, eval_kind: str = "internal", eval_dir: str = "", train_dataset: str = "",
                    config: dict | None = None) -> pd.DataFrame:
    """Counts rows of one evaluation with the context columns (:func:`with_context`) and the added columns
    ``eval_dir, eval_kind, is_ensemble, architecture`` (module docstring); for frames built by hand or read
    elsewhere. ``train_dataset`` (default: the rows' first ``dataset``) is removed from run ids as a prefix."""
    out = with_context(df, config)
    out["eval_dir"] = str(eval_dir)
    out["eval_kind"] = eval_kind
    out["train_split_policy"] = training_policies(out) if len(out) else out["split_policy"]
    return _add_labels(out, train_dataset or (str(out["dataset"].iloc[0]) if len(out) else ""))


def _read_eval(path: Path, study_dir: Path, cache: dict) -> pd.DataFrame:
    df = read_counts(path)  # digest-verified, schema-checked
    extra = [c for c in CONTEXT_DEFAULTS if c not in df.columns and c in pq.read_schema(path).names]
    if extra and len(df) == pq.read_metadata(path).num_rows:  # columns newer than this reader's schema
        df = pd.concat([df, pd.read_parquet(path, columns=extra)], axis=1)
    cfg = _config_of(_run_folder(path.parent, study_dir), cache)
    kind = "external" if "external" in path.relative_to(study_dir).parts[:-1] else "internal"
    return annotate_counts(df, kind, str(path.parent), str((cfg.get("data") or {}).get("name", "")), cfg)


def _read_metrics(eval_dirs: list[Path], notes: list[str]) -> pd.DataFrame | None:
    frames = []
    for d in eval_dirs:
        mp = d / "metrics.parquet"
        if not mp.is_file():
            notes.append(f"{mp}: missing; HD95/NSD of that evaluation are n/a (run `msb metrics`)")
            continue
        check_listed_digest(d, "metrics.parquet")
        frames.append(pd.read_parquet(mp))
    return pd.concat(frames, ignore_index=True) if frames else None


def _read_profile(study_dir: Path, notes: list[str]) -> pd.DataFrame | None:
    frames = []
    for p in sorted(study_dir.rglob("profile*.parquet")):
        if any(part.startswith(".") for part in p.relative_to(study_dir).parts):
            continue
        try:
            t = pd.read_parquet(p)
        except Exception as e:  # pyarrow errors
            notes.append(f"{p}: unreadable profile table ({type(e).__name__}); efficiency skipped for it")
            continue
        if {"model", "input_h", "latency_ms_median", "gmacs"} <= set(t.columns):
            frames.append(t.assign(profile_file=str(p)))
    return pd.concat(frames, ignore_index=True) if frames else None


def _read_excluded(study_dir: Path) -> pd.DataFrame:
    rows = []
    for p in sorted((study_dir / "_study").rglob("excluded.json")) if (study_dir / "_study").is_dir() else []:
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise MSBError(f"{p}: not valid JSON ({e}); it should be a list of "
                           f"{{architecture, input_size, reason}} objects") from None
        for item in data if isinstance(data, list) else data.get("excluded", []):
            rows.append({"architecture": str(item.get("architecture", item.get("arch", ""))),
                         "input_size": int(item.get("input_size", -1)), "reason": str(item.get("reason", ""))})
    csv = study_dir / "_study" / "exclusions.csv"  # written by msb run: divisor (generation) + out of memory
    if csv.is_file():
        try:
            t = pd.read_csv(csv, dtype={"architecture": str, "reason": str}, keep_default_na=False)
            rows += [{"architecture": str(r.architecture), "input_size": int(r.input_size), "reason": str(r.reason)}
                     for r in t.itertuples()]
        except (OSError, ValueError, AttributeError, pd.errors.ParserError) as e:
            raise MSBError(f"{csv}: unreadable exclusions table ({e}); it needs the columns unit, dataset, "
                           f"architecture, input_size, reason; rerun `msb run` to rewrite it") from None
    out = pd.DataFrame(rows, columns=["architecture", "input_size", "reason"])
    return out.drop_duplicates(["architecture", "input_size"]).reset_index(drop=True)


def load_study(study_dir: str | Path, exclude: tuple[Path, ...] = ()) -> StudyArtifacts:
    """Collect a study's artifacts (module docstring).

    Args:
        study_dir: ``runs/<study>`` (or any folder holding evaluation folders).
        exclude: folders not searched (e.g. the output folder).

    Returns:
        :class:`StudyArtifacts`.

    Raises:
        MSBError: the folder does not exist or holds no ``counts.parquet``; a damaged counts/metrics file (named,
            with the command that regenerates it).
    """
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise MSBError(f"{study_dir}: study folder not found; give runs/<study>")
    files = find_counts_files(study_dir, exclude=list(exclude))
    if not files:
        raise MSBError(f"{study_dir}: no counts.parquet below it; run `msb run` or `msb evaluate` first")
    cache: dict = {}
    counts = pd.concat([_read_eval(f, study_dir, cache) for f in files], ignore_index=True)
    counts["train_split_policy"] = training_policies(counts)  # across evaluations: external rows -> their model's
    notes: list[str] = []
    metrics = _read_metrics([f.parent for f in files], notes)
    try:
        runs = {rd.name: read_run(rd) for rd in find_run_dirs(study_dir, exclude=list(exclude))}
    except MSBError:
        runs = {}
    return StudyArtifacts(study_dir, counts, metrics, _read_profile(study_dir, notes), runs,
                          _read_excluded(study_dir), notes)
