"""Pydantic schema of one explicit run config (the output of ``msb generate``).

Every model forbids unknown keys; :mod:`msb.config.layering` checks keys per source file first so that the
error names the file, the key and the closest valid key. See ``docs/config_reference.md`` for every key.
"""

from __future__ import annotations

import types
import typing
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from msb.config.metrics_schema import MetricsConfig
from msb.config.strict import StrictModel
from msb.config.strategy_schema import STRATEGY_DEFAULT, StrategyConfig, check_strategy
from msb.config.analysis_schema import AnalysisConfig
from msb.config.notifications_schema import NotificationsConfig
from msb.config.cluster_schema import ClusterConfig
from msb.config.pools_schema import BudgetConfig, PoolConfig

__all__ = [
    "StrictModel", "PrepareConfig", "SplitConfig", "DataConfig", "ModelConfig", "OptimizerConfig",
    "SchedulerConfig", "LossConfig", "GradClipConfig", "AugmentConfig", "EarlyStoppingConfig", "TrainConfig",
    "MultiScaleConfig", "NONFINITE_PATIENCE_DEFAULT", "AMP_TO_PRECISION", "TRAIN_HASH_NEUTRAL_DEFAULTS",
    "CheckpointConfig", "EvaluationConfig", "RunConfig",
]


class PrepareConfig(StrictModel):
    """How to create the prepared dataset when ``data.root`` does not exist yet.

    ``converter`` is a name from ``msb.data.converters.CONVERTERS`` (``synthetic``, ``kvasir-seg``, ``folder``);
    ``source`` is the raw dataset folder (ignored by ``synthetic``); ``options`` are passed to the converter.
    """

    converter: str
    source: Optional[str] = None
    options: dict[str, Any] = Field(default_factory=dict)


class SplitConfig(StrictModel):
    """Train/val/test split policy.

    ``fixed`` uses the ``split`` column of ``index.csv``; ``random`` draws a seeded split (group-aware when
    ``group_column`` names a non-empty column). The split used is written to the run folder as ``split.csv``.
    """

    mode: Literal["fixed", "random"] = "random"
    val_fraction: float = Field(0.1, gt=0, lt=1)
    test_fraction: float = Field(0.1, gt=0, lt=1)
    seed: int = 0
    group_column: Optional[str] = "group"


class DataConfig(StrictModel):
    """Dataset and preprocessing.

    ``input_size`` is (height, width) in pixels; images are resized bilinearly (``cv2.INTER_AREA`` when
    shrinking) and masks with nearest neighbour, once, into the preprocessing cache.
    ``max_samples_per_split`` keeps only the first N samples (by ``sample_id``) of each split: for smoke
    tests, never for reported results.

    Labelled fractions (semi-supervised protocols, ``msb.data.labelled``): ``labelled_fraction`` (e.g. 0.1,
    0.3) draws that share of the training split as labelled, group-aware and stratified by empty/non-empty
    masks, with ``labelled_seed`` (default: the run's ``random_seed``); ``labelled_ids`` gives the labelled ids
    instead (a list, or a path to a CSV with a ``sample_id`` column or a run's ``labelled.csv``). Only the
    labelled images train with their masks; the subset is written to ``labelled.csv``. The three keys are left
    out of ``config.yaml`` and the config hash while unset, so existing run ids do not change.

            for key in ("labelled_fraction", "labelled_ids", "labelled_seed", "require_audit", "pool"):
    """

    name: str
    root: str
    prepare: Optional[PrepareConfig] = None
    split: SplitConfig = Field(default_factory=SplitConfig)
    input_size: tuple[int, int] = (128, 128)
    max_samples_per_split: Optional[int] = Field(None, gt=0)
    num_workers: int = Field(0, ge=0)
    cache_dir: Optional[str] = None
    normalize_mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    normalize_std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    labelled_fraction: Optional[float] = Field(None, gt=0, le=1)
    labelled_ids: Optional[list[str] | str] = None
    labelled_seed: Optional[int] = None
    require_audit: Optional[list[Literal["crossing-identical", "crossing-near-duplicate", "crossing-group"]]] = None
    # training pool of a pool-contrast study (msb.config.pools_schema, docs/studies.md); omitted while unset
    pool: Optional[PoolConfig] = None

    @model_validator(mode="after")
    def _one_labelled_policy(self) -> "DataConfig":
        if self.labelled_fraction is not None and self.labelled_ids is not None:
            raise ValueError("give data.labelled_fraction or data.labelled_ids, not both")
        if self.labelled_seed is not None and self.labelled_fraction is None:
            raise ValueError("data.labelled_seed needs data.labelled_fraction (explicit ids are not drawn)")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_labelled(self, handler: Any) -> dict[str, Any]:
        """Dump without the ``labelled_*`` and ``require_audit`` keys while unset (config hashes stay as they were)."""
        data = handler(self)
        if isinstance(data, dict):
            for key in ("labelled_fraction", "labelled_ids", "labelled_seed", "require_audit", "pool"):
                if getattr(self, key) is None:
                    data.pop(key, None)
        return data

    @property
    def labelled_policy(self) -> bool:
        """True when a labelled subset is declared (``labelled_fraction`` or ``labelled_ids``)."""
        return self.labelled_fraction is not None or self.labelled_ids is not None

    @field_validator("input_size")
    @classmethod
    def _positive_size(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] <= 0 or v[1] <= 0:
            raise ValueError("input_size must be two positive integers (height, width)")
        return v


class ModelConfig(StrictModel):
    """Architecture: ``arch`` is a registry name (``msb.models.available_architectures()``), a name of the entry
    point group ``msb.models``, or, with ``target``, a free label of a user model.

    ``encoder_weights``: ``None`` (random init, default), ``imagenet`` (the library's ImageNet weights via timm/smp's
    own Hugging Face download and cache, ``msb weights fetch``) or a local ``.pth``/``.pt``/``.safetensors`` state
    dict of the encoder. ``checkpoint``: a whole-model state dict (our names, or an official release of a polyp
    adapter: ``msb.models.released``) loaded after building. ``target`` (``package.module:Name``): an importable
    class or factory of a user model (``msb.models.user``). ``params`` go to the adapter's (or target's)
    constructor. ``smp_arch``: the smp class of ``arch: smp`` (``msb.models.generic.smp_any``).
    """

    arch: str
    encoder: Optional[str] = None
    encoder_weights: Optional[str] = None
    checkpoint: Optional[str] = None
    target: Optional[str] = None
    params: dict[str, Any] = Field(default_factory=dict)
    smp_arch: Optional[str] = None

    @model_serializer(mode="wrap")
    def _omit_unset_new_keys(self, handler: Any) -> dict[str, Any]:
        """Dump without ``checkpoint`` / ``target`` / ``smp_arch`` while unset (existing config hashes stay)."""
        data = handler(self)
        for key in ("checkpoint", "target", "smp_arch") if isinstance(data, dict) else ():
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @field_validator("encoder_weights")
    @classmethod
    def _none_string(cls, v: Optional[str]) -> Optional[str]:
        # ``pretrained: none`` in the model-zoo docs: the string 'none' means no weights (random init)
        return None if v is None or v.strip().lower() in ("", "none", "null") else v


class OptimizerConfig(StrictModel):
    """Optimizer (``torch.optim.AdamW`` or ``Adam``); ``lr`` is the base learning rate."""

    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(1e-4, ge=0)
    momentum: float = Field(0.9, ge=0)
    # learning rate of the adapter's ``backbone.*`` parameters = lr * backbone_lr_mult (SANet: 0.1)
    backbone_lr_mult: float = Field(1.0, gt=0)


class SchedulerConfig(StrictModel):
    """Learning-rate schedule, stepped once per epoch: ``none``, ``cosine`` (to 0 over the epochs), ``step``."""

    name: Literal["none", "cosine", "step", "multistep"] = "none"
    step_size: int = Field(10, gt=0)
    gamma: float = Field(0.1, gt=0)
    # ``multistep``: multiply the lr by ``gamma`` after each of these epochs (SANet: [64, 96], gamma 0.5)
    milestones: list[int] = Field(default_factory=list)


class LossConfig(StrictModel):
    """Loss. ``structure`` = weighted BCE + weighted IoU with weight 1 + 5·|avgpool31(y) − y| (Wei et al.,
    F3Net, AAAI 2020; PraNet). ``bce_weighting``: ``weighted`` applies the weight to BCE as published;
    ``reference`` reproduces the reference scripts (plain mean BCE, see docs)."""

    name: Literal["structure", "bce", "dice_bce"] = "structure"
    bce_weighting: Literal["weighted", "reference"] = "weighted"


class GradClipConfig(StrictModel):
    """Gradient clipping: ``norm`` (total L2 norm, ``clip_grad_norm_``) or ``value`` (element-wise clamp, as
    PraNet's ``clip_gradient``); ``max`` <= 0 disables it."""

    mode: Literal["norm", "value", "none"] = "norm"
    max: float = 1.0


class AugmentConfig(StrictModel):
    """Training augmentation (albumentations), probabilities in [0, 1]."""

    hflip: float = Field(0.5, ge=0, le=1)
    vflip: float = Field(0.5, ge=0, le=1)
    rotate90: float = Field(0.0, ge=0, le=1)
    brightness_contrast: float = Field(0.0, ge=0, le=1)


class EarlyStoppingConfig(StrictModel):
    """Stop when the selection metric has not improved by ``min_delta`` for ``patience`` epochs."""

    patience: int = Field(10, gt=0)
    min_delta: float = Field(0.0, ge=0)


class MultiScaleConfig(StrictModel):
    """Multi-scale training (PraNet family, SANet), applied to every training batch in the trainer.

    Each rate r gives the size ``round(s · r / size_multiple) · size_multiple`` per side s of
    ``data.input_size``; images are resized bilinearly (align_corners=True), masks bilinearly as soft targets
    (``soft_masks: true``, PraNet) or with nearest neighbour (``false``, SANet). ``sampling: all`` runs every
    rate on each batch (PraNet: 0.75, 1, 1.25), ``random`` draws one rate per batch with ``probabilities``
    (SANet). ``step_per_rate: true`` takes one optimizer step per rate (the reference scripts: 3 steps per
    batch); ``false`` accumulates the gradients of all rates into one step.
    """

    rates: list[float] = Field(default_factory=lambda: [0.75, 1.0, 1.25], min_length=1)
    sampling: Literal["all", "random"] = "all"
    probabilities: Optional[list[float]] = None
    step_per_rate: bool = True
    soft_masks: bool = True
    size_multiple: int = Field(32, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "MultiScaleConfig":
        if any(r <= 0 for r in self.rates):
            raise ValueError("multiscale.rates must be positive")
        if self.probabilities is not None:
            if len(self.probabilities) != len(self.rates) or any(p < 0 for p in self.probabilities) \
                    or abs(sum(self.probabilities) - 1.0) > 1e-6:
                raise ValueError("multiscale.probabilities must give one non-negative probability per rate, "
                                 "summing to 1")
        elif self.sampling == "random":
            raise ValueError("multiscale.sampling 'random' needs multiscale.probabilities")
        return self


#: default of ``train.nonfinite_patience`` (left out of ``config.yaml`` and the config hash when unchanged)
NONFINITE_PATIENCE_DEFAULT = 10

#: the old ``train.amp`` switch -> ``train.precision`` (``on`` was fp16 on CUDA and fp32 on CPU, as fp16 is now)
AMP_TO_PRECISION = {"auto": "auto", "on": "fp16", "off": "fp32"}
_PRECISION_TO_AMP = {v: k for k, v in AMP_TO_PRECISION.items()}

#: keys of ``train`` added after run ids existed, with their defaults: left out of ``config.yaml`` and the config
#: hash while they have these values, so the run ids of existing studies do not change
TRAIN_HASH_NEUTRAL_DEFAULTS: dict[str, Any] = {
    "nonfinite_patience": NONFINITE_PATIENCE_DEFAULT, "compile": False, "cudnn_benchmark": True,
    "pin_memory": True, "persistent_workers": False, "prefetch_factor": None, "strategy": STRATEGY_DEFAULT,
}


class TrainConfig(StrictModel):
    """Training loop settings.

    ``precision``: ``auto`` = bf16 autocast on a CUDA GPU that supports it (``torch.cuda.is_bf16_supported()``),
    else fp16 autocast with a GradScaler; fp32 on CPU. ``fp16`` = fp16 autocast + GradScaler on CUDA (on CPU it
    runs fp32, as ``amp: on`` always did); ``bf16`` = bf16 autocast (no scaler; also on CPU, where PyTorch's CPU
    autocast supports bf16); ``fp32`` = no autocast. The resolved precision is recorded in ``manifest.json``.
    The old ``amp`` key is still read: ``auto`` -> ``auto``, ``on`` -> ``fp16``, ``off`` -> ``fp32``; ``amp: on|off``
    overrides ``precision: auto`` (the value of ``configs/global.yaml``), ``amp: auto`` never overrides, and
    ``amp: on|off`` with a different non-auto ``precision`` is an error. ``config.yaml`` keeps writing the old
    spelling (``amp: auto|on|off``) for the three values that existed before, so config hashes do not change;
    only ``bf16`` is written as ``precision: bf16``.

    ``nonfinite_patience``: with AMP (fp16 GradScaler), the number of consecutive optimizer steps that the scaler
    may skip for overflowing gradients (or that have a non-finite loss) before training stops as diverged; the
    scaler skips a few steps while it calibrates. Without AMP the first non-finite loss or gradient stops
    training.

    ``compile``: wrap the model in ``torch.compile`` for training (off by default). ``cudnn_benchmark``: let cuDNN
    pick the fastest convolution algorithms (CUDA only; always off under ``full_determinism``). ``pin_memory``:
    page-locked host batches with non-blocking copies (CUDA only). ``persistent_workers``, ``prefetch_factor``:
    passed to the training DataLoader when ``data.num_workers > 0``.

    The keys of :data:`TRAIN_HASH_NEUTRAL_DEFAULTS` are left out of ``config.yaml`` (and so of the config hash)
    while they have their defaults, so run ids of existing studies do not change; so is ``budget`` while unset
    (:class:`~msb.config.pools_schema.BudgetConfig`: equal epochs or equal optimizer steps, :mod:`msb.engine.budget`).
    """

    epochs: int = Field(10, gt=0)
    batch_size: int = Field(8, gt=0)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    grad_clip: GradClipConfig = Field(default_factory=GradClipConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    early_stopping: Optional[EarlyStoppingConfig] = None
    multiscale: Optional[MultiScaleConfig] = None
    precision: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    # feed inputs in channels-last (NHWC) memory format: the same operations, run by PyTorch's faster NHWC
    # convolution kernels (about 12 % more training images/s for a ResNet-18 U-Net on 2 CPU cores)
    channels_last: bool = True
    device: Literal["auto", "cpu", "cuda"] = "auto"
    nonfinite_patience: int = Field(NONFINITE_PATIENCE_DEFAULT, ge=0)
    compile: bool = False
    cudnn_benchmark: bool = True
    pin_memory: bool = True
    persistent_workers: bool = False
    prefetch_factor: Optional[int] = Field(None, gt=0)
    # equal epochs or equal optimizer steps per training pool (BudgetConfig); omitted while unset
    budget: Optional[BudgetConfig] = None
    # supervised | mean_teacher | cps (msb/config/strategy_schema.py, msb/engine/strategies, docs/training.md)
    strategy: StrategyConfig = Field(default_factory=StrategyConfig)
    #: old keys still accepted in config files (mapped by ``_legacy_amp``)
    LEGACY_KEYS: ClassVar[frozenset[str]] = frozenset({"amp"})

    @model_validator(mode="before")
    @classmethod
    def _legacy_amp(cls, data: Any) -> Any:
        """Map the old ``amp`` key onto ``precision`` (see class docstring)."""
        if not isinstance(data, dict) or "amp" not in data:
            return data
        data = dict(data)
        amp = data.pop("amp")
        if amp not in AMP_TO_PRECISION:
            raise ValueError(f"train.amp {amp!r} is not one of auto, on, off; write train.precision: "
                             f"auto|fp32|fp16|bf16 instead")
        mapped = AMP_TO_PRECISION[amp]
        given = data.get("precision")
        if amp == "auto" or given in (None, "auto", mapped):
            # amp: auto never overrides; amp: on/off overrides precision: auto (e.g. that of configs/global.yaml)
            data["precision"] = mapped if given in (None, "auto") else given
            return data
        raise ValueError(f"train.amp {amp!r} (= precision {mapped}) and train.precision {given!r} disagree; "
                         f"remove train.amp (replaced by train.precision)")

    @model_serializer(mode="wrap")
    def _omit_hash_neutral_defaults(self, handler: Any) -> dict[str, Any]:
        """Dump without the keys of :data:`TRAIN_HASH_NEUTRAL_DEFAULTS` at their defaults and with ``precision``
        in the old ``amp`` spelling where one exists (config hashes stay as they were)."""
        data = handler(self)
        if not isinstance(data, dict):
            return data
        for key, default in {**TRAIN_HASH_NEUTRAL_DEFAULTS, "budget": None}.items():
            if key in data and data[key] == default:
                data.pop(key)
        if self.precision in _PRECISION_TO_AMP:
            out = {}
            for k, v in data.items():  # "amp" where "precision" stands: the old key order, the old YAML
                if k == "precision":
                    out["amp"] = _PRECISION_TO_AMP[v]
                else:
                    out[k] = v
            data = out
        return data


class CheckpointConfig(StrictModel):
    """Checkpoint policy: ``best`` is selected on ``selection_split`` by ``metric`` (image-macro Dice or IoU at
    the evaluation threshold, on the training resolution). ``test`` is refused unless ``recipe: official``
    (:class:`RunConfig`), which reproduces the official scripts that select on the test sets.
    ``keep_resume_state`` (not hashed) keeps a finished run's full resume state (docs/studies.md, "Disk")."""

    metric: Literal["dice", "iou", "loss"] = "dice"
    selection_split: str = "val"
    save: list[Literal["best", "latest"]] = Field(default_factory=lambda: ["best", "latest"])
    keep_resume_state: bool = Field(False, exclude=True)  # False: finished runs drop weights from the state


class EvaluationConfig(StrictModel):
    """Final evaluation: logits are upsampled bilinearly to each image's native size, then
    ``sigmoid(logits) >= threshold`` (``threshold_on: probability``) or ``logits >= threshold``
    (``threshold_on: logit``)."""

    checkpoint: Literal["best", "latest", "both"] = "best"
    split: str = "test"
    threshold: float = 0.5
    threshold_on: Literal["probability", "logit"] = "probability"
    # ``minmax``: per image and class, p <- (p - min p) / (max p - min p + 1e-8) before the threshold, as old
    # polyp test scripts; forces a positive region into every image (docs/models.md). Off by default.
    test_time_normalisation: Literal["none", "minmax"] = "none"
    save_probabilities: bool = True
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    compute_metrics: bool = True
    # semi-supervised runs: average|student|teacher (mean_teacher), average|a|b (cps); unset = average
    two_prediction: Optional[Literal["average", "student", "teacher", "a", "b"]] = None

    @model_serializer(mode="wrap")
    def _omit_unset_two_prediction(self, handler: Any) -> dict[str, Any]:
        """Dump without ``two_prediction`` while unset (config hashes stay as they were)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("two_prediction") is None:
            data.pop("two_prediction", None)
        return data

    @model_validator(mode="after")
    def _threshold_semantics(self) -> "EvaluationConfig":
        if self.threshold_on == "probability" and not 0.0 < self.threshold < 1.0:
            raise ValueError("threshold must lie in (0, 1) when threshold_on is 'probability'")
        if self.test_time_normalisation == "minmax" and self.threshold_on != "probability":
            raise ValueError("test_time_normalisation 'minmax' rescales probabilities; it needs "
                             "threshold_on 'probability'")
        return self


class RunConfig(StrictModel):
    """One explicit, fully resolved run: what ``msb generate`` writes as ``config.yaml``.

    ``recipe``: ``controlled`` (default: the protocol msb recommends) or ``official`` (the overlay
    ``configs/architectures/official/<arch>.yaml`` reproducing the official training and test scripts; the only
    recipe under which ``checkpoint.selection_split: test`` is allowed, and the report flags it). Left out of
    ``config.yaml`` (and the hash) while ``controlled``.

    ``axes``: the study-axis values this run was generated with (dotted key -> value, e.g.
    ``{"data.input_size": [256, 256], "random_seed": 1}``; :mod:`msb.config.generate`), recorded so that every
    counts row names its variant; left out of ``config.yaml`` (and the hash) while empty.
    """

    study: str = "default"
    recipe: Literal["controlled", "official"] = "controlled"
    axes: dict[str, Any] = Field(default_factory=dict)
    run_root: str = "runs"
    random_seed: int = 0
    full_determinism: bool = False
    data: DataConfig
    model: ModelConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    # notifications, statistics setting: excluded from config.yaml and the hash (neither changes what a run computes)
    notifications: NotificationsConfig = Field(default_factory=NotificationsConfig, exclude=True)
    analysis: AnalysisConfig = Field(default_factory=AnalysisConfig, exclude=True)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, exclude=True)  # msb submit (Slurm); not hashed

    @model_validator(mode="after")
    def _test_selection_only_official(self) -> "RunConfig":
        if self.checkpoint.selection_split.strip().lower() == "test" and self.recipe != "official":
            raise ValueError("checkpoint.selection_split: selecting a checkpoint on the split named 'test' leaks "
                             "the test set; use 'val' (only recipe: official reproduces scripts that do it)")
        check_strategy(self.train.strategy, self.evaluation.two_prediction, self.data.labelled_policy)
        return self

    @model_serializer(mode="wrap")
    def _omit_controlled_recipe(self, handler: Any) -> dict[str, Any]:
        """Dump without ``recipe`` while ``controlled`` and without ``axes`` while empty (config hashes of
        existing studies stay)."""
        data = handler(self)
        if isinstance(data, dict) and data.get("recipe") == "controlled":
            data.pop("recipe", None)
        if isinstance(data, dict) and not data.get("axes"):
            data.pop("axes", None)
        return data
