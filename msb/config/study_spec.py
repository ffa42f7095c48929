"""Study-level keys of a study file: ``search``, ``cross_validation``, ``final``, ``analyses`` (docs/studies.md,
docs/protocols.md).

These pydantic models are fields of :class:`msb.config.generate.StudySpec`; every key is optional and a study
file without them behaves exactly as before (one run per dataset x architecture).

Search parameters are dotted run-config keys (``train.optimizer.lr``, ``model.params.decoder_channels``):
a trial's run config is the study's run config with those keys replaced (:func:`apply_params`), validated
like any other run config, so a trial is an ordinary run folder whose id carries its own config hash.

This module imports only pydantic, itertools/json and :mod:`msb.config` helpers (no training code).
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_serializer, model_validator

from msb.config.layering import check_keys, deep_merge
from msb.config.schema import RunConfig, StrictModel
from msb.errors import MSBError

__all__ = ["SamplerSpec", "SearchSpec", "CrossValidationSpec", "ExternalSpec", "FinalSpec", "ProfileSpec",
           "AnalysesSpec", "ParamDistribution",
           "grid_points", "param_distributions", "apply_params", "FORBIDDEN_PARAM_PREFIXES", "params_to_nested"]

#: Run-config keys a search may not vary: they define the data, the split (and so the folds) or where runs go.
FORBIDDEN_PARAM_PREFIXES: tuple[str, ...] = ("study", "run_root", "data.name", "data.root", "data.prepare",
                                             "data.split", "data.cache_dir", "data.max_samples_per_split",
                                             "data.pool")


class SamplerSpec(StrictModel):
    """Optuna sampler of a Hyperband search: ``tpe`` (``TPESampler``, Bergstra et al., NeurIPS 2011) or
    ``random`` (``RandomSampler``). ``seed`` defaults to the run config's ``random_seed``; the sampler is
    re-seeded with ``seed + trial number`` before each trial so that a resumed single-worker study samples
    exactly what an uninterrupted one samples."""

    name: Literal["tpe", "random"] = "tpe"
    seed: Optional[int] = None


class ParamDistribution(StrictModel):
    """One Hyperband search dimension.

    ``type: float`` -> ``suggest_float(low, high, log, step)``; ``type: int`` -> ``suggest_int(low, high,
    step, log)``; ``type: categorical`` -> ``suggest_categorical(choices)``. Non-scalar choices (lists, e.g.
    decoder channel tuples) are passed to optuna as their JSON text and decoded again.
    """

    type: Literal["float", "int", "categorical"]
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Optional[list[Any]] = None

    @model_validator(mode="after")
    def _check(self) -> "ParamDistribution":
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None:
                raise ValueError("a categorical parameter takes 'choices', not low/high")
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} parameter takes low/high, not 'choices'")
        if self.low is None or self.high is None or not self.low < self.high:
            raise ValueError(f"a {self.type} parameter needs low < high, got low={self.low}, high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError("log scale needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("log scale and step cannot be combined (optuna)")
        if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ValueError("an int parameter needs integer low/high")
        return self


class SearchSpec(StrictModel):
    """Hyperparameter search on the run config's train/val split (never on the test split).

    - ``method``: ``none`` (no search), ``grid`` (every combination of the listed values, each trained for
      ``max_epochs``) or ``hyperband`` (``n_trials`` trials sampled by ``sampler``, stopped early by optuna's
      ``HyperbandPruner`` (Li et al., JMLR 2018) with ``min_resource = min_epochs``, ``max_resource =
      max_epochs``, ``reduction_factor``).
    - ``metric``: objective, the best per-epoch validation value of ``dice``/``iou`` (maximised) or ``loss``
      (minimised); default: the run config's ``checkpoint.metric``.
    - ``params``: dotted run-config key -> list of values (``grid``; also accepted by ``hyperband`` as a
      categorical choice) or a :class:`ParamDistribution` mapping (``hyperband``).
    - ``max_epochs``: the budget of one trial in epochs (sets ``train.epochs`` of the trial configs); default
      the run config's ``train.epochs``.
    """

    method: Literal["none", "grid", "hyperband"] = "none"
    metric: Optional[Literal["dice", "iou", "loss"]] = None
    params: dict[str, Any] = Field(default_factory=dict)
    n_trials: Optional[int] = Field(None, gt=0)
    max_epochs: Optional[int] = Field(None, gt=0)
    min_epochs: int = Field(1, gt=0)
    reduction_factor: int = Field(3, ge=2)
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)

    @field_validator("params")
    @classmethod
    def _param_names(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if not isinstance(name, str) or not name or any(not p for p in name.split(".")):
                raise ValueError(f"parameter name {name!r} must be a dotted run-config key like train.optimizer.lr")
            for bad in FORBIDDEN_PARAM_PREFIXES:
                if name == bad or name.startswith(bad + "."):
                    raise ValueError(f"parameter {name!r} cannot be searched: '{bad}' fixes the data, the split "
                                     f"(and so the folds) or where runs are stored")
        return v

    @model_validator(mode="after")
    def _check_method(self) -> "SearchSpec":
        if self.method == "none":
            if self.params:
                raise ValueError("method 'none' takes no params; set method to grid or hyperband")
            return self
        if not self.params:
            raise ValueError(f"method '{self.method}' needs at least one entry in 'params'")
        if self.method == "grid":
            for name, values in self.params.items():
                if not isinstance(values, list) or not values:
                    raise ValueError(f"grid parameter {name!r} needs a non-empty list of values, got {values!r}")
            if self.n_trials is not None:
                raise ValueError("n_trials is not used by a grid search (every combination is one trial); remove it")
        else:
            if self.n_trials is None:
                raise ValueError("a hyperband search needs n_trials (the number of sampled configurations)")
            param_distributions(self.params)  # raises ValueError on a bad distribution
            if self.max_epochs is not None and self.min_epochs > self.max_epochs:
                raise ValueError(f"min_epochs ({self.min_epochs}) exceeds max_epochs ({self.max_epochs})")
        return self


class CrossValidationSpec(StrictModel):
    """Group-aware K-fold cross-validation.

    - ``k``: number of folds (>= 2).
    - ``group_column``: ``index.csv`` column whose samples must stay in one fold (patient, video, centre);
      ``null`` = every sample is its own group. Empty cells are groups of one sample.
    - ``stratify``: ``null``; ``empty_mask`` (strata = empty vs non-empty reference mask); or an ``index.csv``
      column name (e.g. a class column). Uses ``StratifiedGroupKFold``; without it ``GroupKFold``.
    - ``seed``: fold seed; default the run config's ``data.split.seed``.
    - ``include_test``: ``false`` (default): folds cover the non-test samples of ``data.split`` and every fold
      is evaluated on the same held-out test split; ``true``: folds cover every sample, there is no internal
      test split and only external datasets are evaluated.
    - ``inner_val``: optional fraction in (0, 1). For each fold ``j`` about this fraction of fold ``j``'s
      training rows (whole groups) becomes the split ``inner_val`` of the fold run's ``split.csv``, on which
      its checkpoint is selected (``checkpoint.selection_split: inner_val``); the held-out fold stays ``val``.
      Needed to score out-of-fold predictions (``final.test_split: val``) with ``final.checkpoint: best``.
      Drawn once (:func:`msb.study.folds.assign_inner_val`) and kept in ``_study/<unit>/inner_val.csv``.
      Left out of the dump (spec hash) while unset.
    """

    k: int = Field(ge=2)
    group_column: Optional[str] = "group"
    stratify: Optional[str] = None
    seed: Optional[int] = None
    include_test: bool = False
    inner_val: Optional[float] = Field(None, gt=0.0, lt=1.0)

    @model_serializer(mode="wrap")
    def _omit_unset_inner_val(self, handler: Any) -> dict[str, Any]:
        """Dump without ``inner_val`` while unset (spec hashes of existing study folders stay as they were)."""
        data = handler(self)
        if isinstance(data, dict) and self.inner_val is None:
            data.pop("inner_val", None)
        return data


class ExternalSpec(StrictModel):
    """An external test set: a dataset config name (``configs/datasets/<dataset>.yaml``) or a prepared-dataset
    folder (relative to the study file).

    - ``name``: label used in the counts ``dataset`` column and folder names; default the dataset's
      ``data.name`` (or the folder name).
    - ``split``: ``all`` (every sample) or a value of its ``index.csv`` ``split`` column.
    - ``class_map``: model class (id or name) -> list of external classes (ids or names) whose union is the
      reference of that model class; external classes not listed count as background. Default: identity
      when both datasets have the same foreground class ids.
    - ``max_samples``: evaluate only the first N samples by ``sample_id`` (smoke tests only).
    - ``for_datasets``: only the units trained on these study datasets are evaluated on it (default: all).
    - ``merge_model_classes``: merged class name -> model classes (ids or names) whose predictions are united
      before scoring (pixel-wise OR; e.g. ``{polyp: [neoplastic, non_neoplastic]}`` scores a 3-class NeoPolyp
      model on a binary polyp set); ``class_map`` keys then name the merged classes. Every model foreground class
      must be in exactly one group.
    """

    dataset: str
    name: Optional[str] = None
    split: str = "all"
    class_map: Optional[dict[Union[int, str], list[Union[int, str]]]] = None
    max_samples: Optional[int] = Field(None, gt=0)
    for_datasets: Optional[list[str]] = None
    merge_model_classes: Optional[dict[str, list[Union[int, str]]]] = None

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: Any) -> dict[str, Any]:
        """Dump without ``for_datasets`` / ``merge_model_classes`` while unset (existing hashes stay)."""
        data = handler(self)
        for key in ("for_datasets", "merge_model_classes") if isinstance(data, dict) else ():
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and (not v or "/" in v or "\\" in v or v in (".", "..")):
            raise ValueError(f"external name {v!r} must be a non-empty folder name without slashes")
        return v


class ProfileSpec(StrictModel):
    """``analyses.profile``: run ``msb profile --study`` (model-only timing at batch 1, docs/profiling.md) at the
    end of ``msb run`` so that the efficiency table has its input. ``None`` values take the device's defaults
    (cuda: 100 warm-up, 1,000 timed passes, 5 repeats; cpu: 10, 100, 3)."""

    device: Literal["cpu", "cuda"] = "cpu"
    warmup: Optional[int] = Field(default=None, ge=0)
    timed_passes: Optional[int] = Field(default=None, ge=1)
    repeats: Optional[int] = Field(default=None, ge=1)
    batch_size: int = Field(default=1, ge=1)


class AnalysesSpec(StrictModel):
    """``analyses``: the protocol analyses (``msb.analysis.protocol``) that ``msb run`` writes into
    ``runs/<study>/protocol/`` once every unit is done (docs/protocols.md).

    - ``names``: analysis names or ``[all]``; checked against the registry when the analyses run.
    - ``profile``: :class:`ProfileSpec` (profile the study's models first), or ``null`` (use a profile table
      already below the study folder, else the efficiency table is skipped with its reason).
    - ``n_boot``, ``seed``, ``level``: bootstrap replicates (Wilcoxon CIs and the resolution ΔDSC), seed, level.
    - ``allow_mixed_protocols``: as ``--allow-mixed-protocols``.
    - ``efficiency_num_classes``: when the study profiles a model at several class counts (datasets with different
      classes), the count the efficiency table shows (the MSB paper timed a NeoPolyp checkpoint: 2); default the
      first profiled.
    """

    names: list[str] = Field(default_factory=lambda: ["all"], min_length=1)
    profile: Optional[ProfileSpec] = None
    n_boot: int = Field(default=1000, ge=10)
    seed: int = 0
    level: float = Field(default=0.95, gt=0.0, lt=1.0)
    allow_mixed_protocols: bool = False
    efficiency_num_classes: Optional[int] = Field(default=None, ge=1)


class FinalSpec(StrictModel):
    """Final, checkpoint-backed evaluation.

    - ``checkpoint``: ``best``/``latest``/``both``; sets ``evaluation.checkpoint`` of every run config.
    - ``test_split``: split evaluated in each fold run's ``split.csv`` (``test`` = held-out test, ``val`` =
      the held-out fold); sets ``evaluation.split`` of every run config.
    - ``ensemble``: also score the pixel-wise strict-majority ensemble of the fold predictions (foreground
      where more than K/2 of the K folds predict foreground) on every evaluation set shared by all folds.
    - ``external``: :class:`ExternalSpec` list, evaluated with every fold checkpoint (no retraining, no
      threshold tuning).
    """

    checkpoint: Optional[Literal["best", "latest", "both"]] = None
    test_split: Optional[str] = None
    ensemble: bool = True
    external: list[ExternalSpec] = Field(default_factory=list)

    @field_validator("test_split")
    @classmethod
    def _test_split(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in ("test", "val", "train"):
            raise ValueError(f"test_split must be a split of split.csv (test, val or train), got {v!r}")
        return v

    @model_validator(mode="after")
    def _unique_external(self) -> "FinalSpec":
        labels = [e.name or e.dataset for e in self.external]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise ValueError(f"external datasets {dup} are listed twice; give each a distinct 'name'")
        return self


# ------------------------------------------------------------------------------------------------ params
def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def param_distributions(params: dict[str, Any]) -> dict[str, ParamDistribution]:
    """Hyperband search space: each value a list (categorical choices) or a :class:`ParamDistribution` mapping.

    Raises:
        ValueError: a value that is neither (the message names the parameter).
    """
    out: dict[str, ParamDistribution] = {}
    for name, v in params.items():
        try:
            if isinstance(v, list):
                out[name] = ParamDistribution(type="categorical", choices=v)
            elif isinstance(v, dict):
                out[name] = ParamDistribution.model_validate(v)
            else:
                raise ValueError(f"expected a list of choices or a mapping with 'type', got {v!r}")
        except ValidationError as exc:
            raise ValueError(f"parameter {name!r}: {exc.errors()[0]['msg']}") from None
        except ValueError as exc:
            raise ValueError(f"parameter {name!r}: {exc}") from None
    return out


def grid_points(params: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the grid values, in file order (the last parameter varies fastest), as
    ``itertools.product``. ``{a: [1, 2], b: [x, y]}`` -> ``[{a:1,b:x}, {a:1,b:y}, {a:2,b:x}, {a:2,b:y}]``."""
    names = list(params)
    return [dict(zip(names, combo)) for combo in itertools.product(*(params[n] for n in names))]


def params_to_nested(params: dict[str, Any]) -> dict[str, Any]:
    """``{"train.optimizer.lr": 1e-3}`` -> ``{"train": {"optimizer": {"lr": 1e-3}}}``.

    Raises:
        ValueError: one key is a prefix of another (``train.optimizer`` and ``train.optimizer.lr``).
    """
    nested: dict[str, Any] = {}
    for name in sorted(params):
        parts = name.split(".")
        node = nested
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"parameter {name!r} lies inside parameter {'.'.join(parts[:parts.index(p) + 1])!r}")
            node = nxt
        if parts[-1] in node:
            raise ValueError(f"parameter {name!r} contains other searched parameters; search either it or its keys")
        node[parts[-1]] = params[name]
    return nested


def apply_params(cfg: RunConfig, params: dict[str, Any], where: str, extra: dict[str, Any] | None = None
                 ) -> RunConfig:
    """Return ``cfg`` with the dotted keys ``params`` replaced (then the nested mapping ``extra``), validated.

    Mappings named by a key are replaced key by key (deep merge); lists and scalars are replaced whole.

    Args:
        cfg: a validated run config.
        params: dotted key -> value (JSON-compatible).
        where: file named in error messages (the study file).
        extra: further nested overrides applied after ``params`` (e.g. ``{"train": {"epochs": 3}}``).

    Raises:
        MSBError: an unknown key (naming ``where``, the dotted key and the closest valid key) or a value the run
            config rejects.
    """
    try:
        over = params_to_nested(params)
    except ValueError as exc:
        raise MSBError(f"{where}: search.params: {exc}") from None
    try:
        check_keys(over, RunConfig, where)
    except MSBError as exc:
        raise MSBError(f"{exc} (in search.params)") from None
    data = deep_merge(cfg.model_dump(mode="json"), over)
    if extra:
        data = deep_merge(data, extra)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise MSBError(f"{where}: search parameter value rejected at '{key}': {err['msg']}; "
                       f"params {json.dumps(params, default=str)}") from None


def finite_or_nan(v: Any) -> float:
    """``float(v)`` when finite, else NaN (for objective values read from histories)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f if math.isfinite(f) else float("nan")
