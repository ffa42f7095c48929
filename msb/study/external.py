"""External test sets: resolve a dataset and a class mapping, evaluate a trained run folder on it.

An external dataset is named by a dataset config (``configs/datasets/<name>.yaml``: its ``data.name``,
``data.root`` and ``data.prepare`` are used, so it is prepared on first use like a training dataset) or by
a prepared-dataset folder. Only its images and masks are used: preprocessing (input size, normalisation),
the threshold and the test-time rule come from the evaluated run's config, and nothing is retrained or tuned.

Class mapping (``class_map``): model foreground class (id or name) -> external classes (ids or names) whose
pixel-wise union is the reference for that model class; external classes that are not listed count as
background. Every model foreground class must be mapped; an external class may feed one model class only.
Without ``class_map`` the mapping is the identity, allowed only when both datasets have the same foreground
class ids. Example: a binary polyp model evaluated on a dataset with classes ``benign`` (1) and ``malignant``
(2): ``{1: [1, 2]}`` (or ``{polyp: [benign, malignant]}``). The other direction, a multi-class model on a
binary set, merges the model's predictions first (``merge_model_classes``: :func:`resolve_model_merge`; e.g. a
NeoPolyp model's neoplastic and non-neoplastic predictions united into ``polyp`` before scoring on Kvasir-SEG).

Outputs: ``<run>/evaluation/external/<name>/<role>/{counts.parquet, predictions/, metrics.parquet, DONE}``;
counts rows carry ``dataset = <name>``, ``split = <split>`` (``all`` or the external split used), the run's
``fold`` and the model's class ids and names. ``DONE`` holds the checkpoint SHA-256 and a fingerprint of the
external set (index/classes SHA-256, samples, mapping): a rerun skips only an identical evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from msb.config.layering import load_layer
from msb.config.schema import DataConfig
from msb.data.schema import ClassSpec, PreparedDataset, load_prepared_dataset
from msb.errors import MSBError
from msb.config.study_spec import ExternalSpec
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_file, sha256_json
from msb.utils.progress import Tracker, no_track

__all__ = ["ExternalSet", "load_external_dataset", "resolve_class_map", "resolve_model_merge",
           "parse_class_map_option", "resolve_external", "evaluate_external", "external_eval_dir"]


@dataclass
class ExternalSet:
    """A resolved external test set.

    Attributes:
        name: label (counts ``dataset`` column, folder name).
        dataset: the prepared dataset.
        split: ``all`` or the ``index.csv`` split used.
        sample_ids: samples evaluated, in order.
        class_map: model class id -> external class ids.
        fingerprint: SHA-256 binding index.csv, classes.csv, samples, split and mapping.
    """

    name: str
    dataset: PreparedDataset
    split: str
    sample_ids: list[str]
    class_map: dict[int, tuple[int, ...]]
    fingerprint: str
    merge: dict[int, tuple[int, ...]] | None = None
    merged_classes: list[ClassSpec] | None = None

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for manifests."""
        return {"name": self.name, "root": str(self.dataset.root), "split": self.split,
                "n_samples": len(self.sample_ids),
                "index_sha256": sha256_file(self.dataset.root / "index.csv"),
                "classes_sha256": sha256_file(self.dataset.root / "classes.csv"),
                "class_map": {str(k): list(v) for k, v in self.class_map.items()}, "fingerprint": self.fingerprint,
                **({"merge_model_classes": {c.name: list(self.merge[c.class_id]) for c in self.merged_classes}}
                   if self.merge and self.merged_classes else {})}


def load_external_dataset(ref: str, configs_root: Path | None = None, base_dir: Path | None = None,
                          log: Callable[[str], None] = lambda _m: None) -> tuple[str, PreparedDataset]:
    """Load (preparing it first if needed) the dataset named by ``ref``.

    ``ref`` is tried as ``<configs_root>/datasets/<ref>.yaml`` (a dataset config layer: ``data.root`` relative
    to the working directory, like every run config), then as a prepared-dataset folder (relative to the
    working directory, then to ``base_dir``).

    Returns:
        ``(data.name or folder name, dataset)``.

    Raises:
        MSBError: nothing found under either reading (the message lists the places tried); a dataset config
            without ``data``; any dataset validation error.
    """
    tried = []
    if configs_root is not None:
        cfg_file = Path(configs_root) / "datasets" / f"{ref}.yaml"
        tried.append(str(cfg_file))
        if cfg_file.is_file():
            layer = load_layer(cfg_file)
            if "data" not in layer.data:
                raise MSBError(f"{cfg_file}: a dataset config needs a 'data' section (name, root)")
            try:
                data = DataConfig.model_validate(layer.data["data"])
            except Exception as exc:  # noqa: BLE001 - pydantic error -> one line
                raise MSBError(f"{cfg_file}: invalid data section ({str(exc).splitlines()[0]})") from None
            root = Path(data.root)
            if not (root / "index.csv").is_file():
                if data.prepare is None:
                    raise MSBError(f"{cfg_file}: data.root '{root}' holds no index.csv and the config has no "
                                   f"data.prepare; prepare it with 'msb data prepare'")
                from msb.data.converters import prepare_dataset

                log(f"preparing external dataset '{data.name}' with converter '{data.prepare.converter}' into {root}")
                log(prepare_dataset(data.prepare.converter, data.prepare.source, root, **data.prepare.options).summary())
            return data.name, load_prepared_dataset(root, name=data.name)
    for cand in [Path(ref)] + ([Path(base_dir) / ref] if base_dir is not None else []):
        tried.append(str(cand))
        if (cand / "index.csv").is_file():
            ds = load_prepared_dataset(cand)
            return ds.name, ds
    raise MSBError(f"external dataset {ref!r} not found: no dataset config or prepared dataset (index.csv) at "
                   f"{', '.join(tried)}; give a name from configs/datasets/ or a prepared-dataset folder")


def _class_id(key: Any, classes: Sequence[ClassSpec], what: str, where: str) -> int:
    by_name = {c.name: c.class_id for c in classes}
    ids = {c.class_id for c in classes}
    if isinstance(key, str) and key.strip().lstrip("-").isdigit():
        key = int(key)
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise MSBError(f"{where}: {what} {key!r} must be a class id or name")
    if isinstance(key, int):
        if key not in ids:
            raise MSBError(f"{where}: {what} id {key} does not exist; valid: "
                           + ", ".join(f"{c.class_id} ({c.name})" for c in classes))
        cid = key
    else:
        if key not in by_name:
            raise MSBError(f"{where}: {what} {key!r} does not exist; valid: "
                           + ", ".join(f"{c.class_id} ({c.name})" for c in classes))
        cid = by_name[key]
    if cid == 0:
        raise MSBError(f"{where}: {what} {key!r} is the background class; map foreground classes only")
    return cid


def resolve_class_map(class_map: dict[Any, list[Any]] | None, model_classes: Sequence[ClassSpec],
                      ext_classes: Sequence[ClassSpec], where: str = "class_map") -> dict[int, tuple[int, ...]]:
    """Resolve ids/names of a class mapping (module docstring) to ``{model class id: (external ids, ...)}``.

    Args:
        class_map: model class (id or name) -> list of external classes (ids or names), or None (identity).
        model_classes: the training dataset's classes (``classes.csv``, background included).
        ext_classes: the external dataset's classes.
        where: prefix for error messages (the study file or the CLI option).

    Raises:
        MSBError: unknown or background classes, an unmapped model foreground class, an external class mapped
            twice, an empty list, or no mapping where the foreground class ids differ.
    """
    model_fg = [c.class_id for c in model_classes if c.class_id != 0]
    ext_fg = [c.class_id for c in ext_classes if c.class_id != 0]
    if class_map is None:
        if model_fg != ext_fg:
            raise MSBError(f"{where}: the model's foreground classes "
                           f"{[(c.class_id, c.name) for c in model_classes if c.class_id]} differ from the external "
                           f"dataset's {[(c.class_id, c.name) for c in ext_classes if c.class_id]}; declare a "
                           f"class_map (model class -> external classes)")
        return {c: (c,) for c in model_fg}
    out: dict[int, tuple[int, ...]] = {}
    owner: dict[int, int] = {}
    for key, values in class_map.items():
        m = _class_id(key, model_classes, "model class", where)
        if m in out:
            raise MSBError(f"{where}: model class {key!r} is listed twice")
        if isinstance(values, (int, str)):
            values = [values]
        if not values:
            raise MSBError(f"{where}: model class {key!r} maps to no external class; list at least one")
        ids = []
        for v in values:
            e = _class_id(v, ext_classes, "external class", where)
            if e in owner and owner[e] != m:
                raise MSBError(f"{where}: external class {v!r} is mapped to two model classes ({owner[e]} and {m})")
            owner[e] = m
            if e not in ids:
                ids.append(e)
        out[m] = tuple(sorted(ids))
    missing = [c for c in model_fg if c not in out]
    if missing:
        names = {c.class_id: c.name for c in model_classes}
        raise MSBError(f"{where}: model class(es) {[f'{c} ({names[c]})' for c in missing]} are not mapped; "
                       f"every model foreground class needs its external classes")
    return dict(sorted(out.items()))


def parse_class_map_option(items: Sequence[str]) -> dict[str, list[str]] | None:
    """``["1=1,2", "polyp=lesion"]`` (CLI ``--class-map``) -> ``{"1": ["1", "2"], "polyp": ["lesion"]}``.

    Raises:
        MSBError: an item without ``=`` or with an empty side.
    """
    if not items:
        return None
    out: dict[str, list[str]] = {}
    for it in items:
        key, sep, vals = it.partition("=")
        values = [v.strip() for v in vals.split(",") if v.strip()]
        if not sep or not key.strip() or not values:
            raise MSBError(f"--class-map {it!r}: expected MODEL_CLASS=EXT_CLASS[,EXT_CLASS...] (ids or names), "
                           f"e.g. 1=1,2 or polyp=benign,malignant")
        out[key.strip()] = values
    return out


def resolve_external(spec: ExternalSpec, model_classes: Sequence[ClassSpec], configs_root: Path | None,
                     base_dir: Path | None, where: str, log: Callable[[str], None] = lambda _m: None) -> ExternalSet:
    """Load the dataset of ``spec``, select its samples and resolve its class mapping.

    Raises:
        MSBError: see :func:`load_external_dataset`, :func:`resolve_class_map`; an empty sample selection.
    """
    ds_name, ds = load_external_dataset(spec.dataset, configs_root, base_dir, log)
    name = spec.name or ds_name
    if spec.split == "all":
        ids = [str(s) for s in ds.index["sample_id"]]
    else:
        col = ds.index["split"].fillna("").astype(str).str.strip()
        ids = [str(s) for s, sp in zip(ds.index["sample_id"], col) if sp == spec.split]
    if spec.max_samples:
        ids = sorted(ids)[: spec.max_samples]
    if not ids:
        raise MSBError(f"{where}: external dataset {name!r} ({ds.root}) has no samples in split {spec.split!r}; "
                       f"use split: all or one of the values of its index.csv split column")
    merge, merged = None, None
    if spec.merge_model_classes:
        merge, merged = resolve_model_merge(spec.merge_model_classes, model_classes,
                                            f"{where} (external {name!r} merge_model_classes)")
        model_classes = [ClassSpec(0, "background", (0,)), *merged]
    cmap = resolve_class_map(spec.class_map, model_classes, ds.classes, f"{where} (external {name!r} class_map)")
    fields = {"index": sha256_file(ds.root / "index.csv"), "classes": sha256_file(ds.root / "classes.csv"),
              "ids": ids, "split": spec.split, "name": name, "class_map": {str(k): list(v) for k, v in cmap.items()}}
    if merge:  # only then: fingerprints of existing external evaluations stay
        fields["merge_model_classes"] = {str(k): list(v) for k, v in merge.items()}
    return ExternalSet(name, ds, spec.split, ids, cmap, sha256_json(fields), merge, merged)


def resolve_model_merge(groups: dict[str, list[Any]], model_classes: Sequence[ClassSpec], where: str
                        ) -> tuple[dict[int, tuple[int, ...]], list[ClassSpec]]:
    """Resolve ``merge_model_classes`` (merged name -> model classes, ids or names).

    Returns:
        ``(merged class id -> model class ids, merged classes)``; merged ids are 1, 2, ... in the file's order,
        each :class:`ClassSpec` named by its key (raw values ``(id,)``, never read from a mask).

    Raises:
        MSBError: an unknown or background model class, a model class in two groups or in none, an empty group.
    """
    merge: dict[int, tuple[int, ...]] = {}
    owner: dict[int, str] = {}
    for k, (name, members) in enumerate(groups.items(), 1):
        members = [members] if isinstance(members, (int, str)) else list(members)
        if not members:
            raise MSBError(f"{where}: merged class {name!r} lists no model class")
        ids = []
        for m in members:
            c = _class_id(m, model_classes, "model class", where)
            if c in owner:
                raise MSBError(f"{where}: model class {m!r} is in two merged classes ({owner[c]!r} and {name!r})")
            owner[c] = name
            ids.append(c)
        merge[k] = tuple(sorted(ids))
    missing = [c.name for c in model_classes if c.class_id != 0 and c.class_id not in owner]
    if missing:
        raise MSBError(f"{where}: model class(es) {missing} are in no merged class; list every foreground class")
    return merge, [ClassSpec(k, str(name), (k,)) for k, name in enumerate(groups, 1)]


def external_eval_dir(run_dir: Path, name: str, role: str) -> Path:
    """``<run_dir>/evaluation/external/<name>/<role>``."""
    return Path(run_dir) / "evaluation" / "external" / name / role


def evaluate_external(run_dir: Path, roles: Sequence[str], ext: ExternalSet, train_ds: PreparedDataset,
                      track: Tracker = no_track, log: Callable[[str], None] = lambda _m: None,
                      force: bool = False) -> list[Path]:
    """Evaluate checkpoints ``roles`` of ``run_dir`` on ``ext`` (see module docstring); skip evaluations whose
    ``DONE`` matches. Returns the counts paths.

    Leftovers of interrupted writes in the run folder are removed first; each evaluation folder is written into
    a staging folder and swapped in whole (:func:`msb.evaluation.evaluator.evaluate_checkpoint`), ``DONE`` after
    the swap, so ``--force`` keeps the old complete evaluation until the new one is complete.

    Raises:
        MSBError: not a run folder; a missing/changed checkpoint, or a checkpoint file whose record is gone;
            a finished evaluation with files missing; mask values not in the external classes.csv.
    """
    from msb.config.layering import load_yaml
    from msb.config.schema import RunConfig
    from msb.engine.runner import run_fold
    from msb.evaluation.evaluator import ExternalTarget, evaluate_checkpoint
    from msb.models.checkpoint import read_records
    from msb.utils.evaluation_folder import check_done_folder, unrecorded_checkpoint_error
    from msb.utils.interrupted import clean_interrupted_writes

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise MSBError(f"{run_dir}: not a run folder (no config.yaml); give runs/<study>/<run_id>")
    clean_interrupted_writes(run_dir, log)
    cfg = RunConfig.model_validate(load_yaml(run_dir / "config.yaml"))
    config_hash = (run_dir / "config.sha256").read_text().strip()
    records = read_records(run_dir)
    out = []
    for role in roles:
        err = unrecorded_checkpoint_error(run_dir, role, records)
        if err is not None:
            raise err
        if role not in records:
            raise MSBError(f"{run_dir}: no '{role}' checkpoint recorded; train the run first or choose another role")
        d = external_eval_dir(run_dir, ext.name, role)
        marker = {"checkpoint_sha256": records[role].sha256, "fingerprint": ext.fingerprint}
        done = d / "DONE"
        if not force and done.is_file():
            try:
                old = json.loads(done.read_text())
            except ValueError:
                old = None
            if old == marker:
                check_done_folder(d)
                log(f"[{run_dir.name}] external evaluation '{ext.name}' ({role}) already done, skipped")
                out.append(d / "counts.parquet")
                continue
        target = ExternalTarget(ext.dataset, ext.name, ext.split, ext.sample_ids, ext.class_map, d, ext.merge,
                                ext.merged_classes)
        res = evaluate_checkpoint(run_dir, cfg, train_ds, role, run_dir.name, config_hash, track=track,
                                  fold=run_fold(run_dir), external=target)
        marker["checkpoint_sha256"] = res.checkpoint_sha256 or marker["checkpoint_sha256"]
        atomic_write_text(done, json.dumps(marker))  # DONE last, after the new folder is in place
        log(f"[{run_dir.name}] evaluated '{role}' on external '{ext.name}' ({res.n_images} images) -> {res.counts_path}")
        out.append(res.counts_path)
    return out
