"""Study -> explicit run configs (``msb generate``).

A study file names datasets x architectures and overrides::

    study: kvasir_unet_cpu
    datasets: [kvasir_seg]          # configs/datasets/kvasir_seg.yaml
    architectures: [unet_r18]       # configs/architectures/unet_r18.yaml
    overrides: {train: {epochs: 9}}  # applied after the layers
    axes:                           # optional: one run per combination (cartesian product), applied last
      data.input_size: [[256, 256], [512, 512]]
      random_seed: [0, 1, 2]

Layers, lowest first: ``global.yaml`` -> dataset -> architecture -> (with ``recipe: official``)
``architectures/official/<arch>.yaml`` -> study ``overrides`` -> ``architecture_overrides[<arch>]`` (deep merge,
later wins). The configs root is
``configs_root`` if given (relative to the study file), else the nearest folder above the study file that
holds ``global.yaml``. Each run config is validated with :class:`msb.config.schema.RunConfig` and hashed:
SHA-256 of the canonical JSON of the validated config.

``axes`` maps dotted config keys to lists of values; every combination (first key slowest) becomes one run per
dataset x architecture, with the combination recorded in the run config's ``axes`` (so each counts row names
its variant, :func:`msb.evaluation.protocol_context.protocol_context`). An axis key must be a valid config key
(the same check as any layer); a key that is also in ``overrides`` is overridden by the axis.

``pools`` and ``seeds`` (training-pool contrasts, :mod:`msb.config.pools_schema`) add the axes ``data.pool`` (each
pool's definition; its slug is the pool name) and ``random_seed`` after the study's own ``axes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import Field

from msb.config.layering import Provenance, check_keys, deep_merge, load_layer, validate_layers
from msb.config.schema import RunConfig, StrictModel
from msb.errors import MSBError, SizeNotDivisibleError
from msb.config.cluster_schema import ClusterConfig
from msb.config.study_spec import AnalysesSpec, CrossValidationSpec, FinalSpec, SearchSpec
from msb.config.pools_schema import ContrastsSpec, PoolSpec, pool_axes
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_json

__all__ = ["StudySpec", "GeneratedRun", "load_study", "generate_runs", "axis_combinations", "axes_slug", "write_run_config", "config_hash",
           "run_config_to_yaml", "find_configs_root"]


class StudySpec(StrictModel):
    """Schema of a study file (see module docstring)."""

    study: str
    configs_root: Optional[str] = None
    run_root: Optional[str] = None
    datasets: list[str] = Field(min_length=1)
    architectures: list[str] = Field(min_length=1)
    overrides: dict[str, Any] = Field(default_factory=dict)
    # architecture name -> nested keys merged after ``overrides`` for that architecture's runs only (e.g. each
    # architecture's smallest input size in a CI smoke study); every name must be one of ``architectures``
    architecture_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # study axes: dotted key -> list of values, one run per combination (module docstring)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    # ``official``: layer configs/architectures/official/<arch>.yaml after the architecture (docs/models.md)
    recipe: Literal["controlled", "official"] = "controlled"
    # study-level keys (msb/study, docs/studies.md); absent = one plain run per dataset x architecture
    search: Optional[SearchSpec] = None
    cross_validation: Optional[CrossValidationSpec] = None
    final: Optional[FinalSpec] = None
    # training-pool contrasts (msb/config/pools_schema.py): pools x seeds become the axes data.pool x random_seed
    pools: list[PoolSpec] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    contrasts: Optional[ContrastsSpec] = None
    # protocol analyses written at the end of msb run (docs/protocols.md); not part of any unit's spec hash
    analyses: Optional[AnalysesSpec] = None
    # ``exclude``: an architecture without a config file, or whose model.arch is not registered in this
    # installation, gets no unit and is recorded as excluded (a cohort declared before all its models exist)
    unavailable_architectures: Literal["refuse", "exclude"] = "refuse"
    # Slurm resources of msb submit (msb/config/cluster_schema.py), over global.yaml's and overrides' `cluster`
    cluster: Optional[ClusterConfig] = None


@dataclass(frozen=True)
class GeneratedRun:
    """One generated run: ``run_id`` = ``<dataset>-<arch>-<first 8 hex of config_hash>``."""

    run_id: str
    config: RunConfig
    config_hash: str
    dataset: str
    architecture: str



def check_config_name(root: Path, kind: str, name: str, study_path: str | Path) -> None:
    """Refuse a study's dataset / architecture name without a config file, suggesting the closest names.

    Args:
        root: the configs root; kind: ``"datasets"`` or ``"architectures"``; name: the name in the study;
        study_path: the study file (named in the message).

    Raises:
        MSBError: ``root/kind/name.yaml`` does not exist; the message has "did you mean" (difflib close
            matches) and the list of available names.
    """
    import difflib

    if (root / kind / f"{name}.yaml").is_file():
        return
    avail = sorted(p.stem for p in (root / kind).glob("*.yaml")) if (root / kind).is_dir() else []
    close = difflib.get_close_matches(name, avail, n=3, cutoff=0.5)
    raise MSBError(f"{study_path}: unknown {kind[:-1]} '{name}' (no {root / kind / (name + '.yaml')})"
                   + (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "")
                   + f" available: {', '.join(avail) if avail else 'none'}")

def config_hash(cfg: RunConfig) -> str:
    """SHA-256 (hex) of the canonical JSON (sorted keys, compact) of ``cfg.model_dump(mode='json')``, without
    ``run_root`` (where a run is stored does not change what it computes)."""
    data = cfg.model_dump(mode="json")
    data.pop("run_root", None)
    return sha256_json(data)


def run_config_to_yaml(cfg: RunConfig) -> str:
    """Explicit YAML of a run config (every key, defaults included)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def find_configs_root(study_path: str | Path, explicit: str | None = None) -> tuple[Path, str]:
    """The configs root of a study file (the folder with ``global.yaml``, ``datasets/``, ``architectures/``), by
    one rule, first match wins:

    1. ``configs_root`` of the study (relative to the study file's folder), if given;
    2. the nearest folder above the study file (its own folder included) that holds ``global.yaml``;
    3. ``./configs`` of the working directory, if it holds ``global.yaml`` (a study kept anywhere, run from a
       project folder).

    Returns:
        ``(root, rule)``: the absolute root and which rule found it (for the log).

    Raises:
        MSBError: the given ``configs_root`` has no ``global.yaml``; no rule finds one.
    """
    study_path = Path(study_path).resolve()
    if explicit is not None:
        root = (study_path.parent / explicit).resolve()
        if not (root / "global.yaml").is_file():
            raise MSBError(f"{study_path}: configs_root '{explicit}' has no global.yaml ({root})")
        return root, "configs_root of the study"
    for folder in [study_path.parent, *study_path.parent.parents]:
        if (folder / "global.yaml").is_file():
            return folder, "nearest folder above the study with global.yaml"
    cwd = Path.cwd() / "configs"
    if (cwd / "global.yaml").is_file():
        return cwd.resolve(), "./configs of the working directory"
    raise MSBError(f"{study_path}: no configs root found: no global.yaml in the study's folder or above, none in "
                   f"./configs of the working directory; run from the project folder or set 'configs_root' in the "
                   f"study (docs/config_reference.md)")


def load_study(path: str | Path) -> tuple[StudySpec, Path]:
    """Read and validate a study file. Returns the spec and the configs root. Raises :class:`MSBError`."""
    path = Path(path).resolve()
    layer = load_layer(path)
    spec = validate_layers(layer.data, StudySpec, layer.provenance, str(path))
    return spec, find_configs_root(path, spec.configs_root)[0]  # type: ignore[arg-type]


def _check_model_fits(cfg: RunConfig, prov: Provenance, default_file: str) -> None:
    """Fail at generation time, naming the file, when ``model.arch`` is not registered or ``data.input_size``
    is not a multiple of the architecture's ``size_divisor``."""
    from msb.models.registry import architecture_class  # models import torch: only when generating

    arch_file = prov.get(("model", "arch"), prov.get(("model",), default_file))
    if cfg.model.target:  # a user model (msb.models.user): its class says its divisor, 32 when silent
        from msb.models.user import target_size_divisor

        target_file = prov.get(("model", "target"), arch_file)
        try:
            div = target_size_divisor(cfg.model.target)
        except MSBError as exc:
            raise MSBError(f"{target_file}: {exc}") from exc
    else:
        cls = architecture_class(cfg.model.arch, f"{arch_file}: key 'model.arch'")
        div = int(getattr(cls, "size_divisor", 1) or 1)
    h, w = cfg.data.input_size
    if h % div or w % div:
        size_file = prov.get(("data", "input_size"), prov.get(("data",), default_file))
        up = (-(-h // div) * div, -(-w // div) * div)
        raise SizeNotDivisibleError(f"{size_file}: key 'data.input_size': {h}x{w} is not a multiple of {div}, which "
                       f"'{cfg.model.arch}' needs; use e.g. [{up[0]}, {up[1]}]")


def axis_combinations(axes: dict[str, list[Any]], where: str) -> list[dict[str, Any]]:
    """Every combination of the study's ``axes`` (dotted key -> values), first key slowest; ``[{}]`` when none.

    Args:
        axes: e.g. ``{"data.input_size": [[256, 256], [512, 512]], "random_seed": [0, 1]}``.
        where: the study file, named in errors.

    Returns:
        A list of ``{dotted key: value}`` dicts (len = product of the list lengths).

    Raises:
        MSBError: an axis with no values, or a value listed twice on one axis.
    """
    import itertools
    import json

    for key, values in axes.items():
        if not values:
            raise MSBError(f"{where}: key 'axes.{key}' has no values; give a list of at least one value")
        seen = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(seen)) != len(seen):
            raise MSBError(f"{where}: key 'axes.{key}' lists a value twice ({values}); list each value once")
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def axes_slug(axes: dict[str, Any]) -> str:
    """A folder-safe name for one axis combination (study unit names): last key part + value, ``-`` between
    axes, e.g. ``{"data.input_size": [128, 128], "random_seed": 1}`` -> ``input_size128x128-random_seed1``."""
    import re

    def value(v: Any) -> str:
        if isinstance(v, (list, tuple)):
            return "x".join(value(x) for x in v)
        if isinstance(v, dict) and isinstance(v.get("name"), str):  # a named value (data.pool): its name
            return v["name"]
        if isinstance(v, dict):
            return "_".join(f"{k}{value(v[k])}" for k in sorted(v))
        return str(v)

    parts = [f"{k.split('.')[-1]}{value(axes[k])}" for k in sorted(axes)]
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))


def generate_runs(study_path: str | Path, exclusions: list[dict[str, Any]] | None = None) -> list[GeneratedRun]:
    """Merge the layers for every dataset x architecture (x axis combination) of the study and validate each
    run config.

    Args:
        study_path: the study YAML.
        exclusions: when a list is given, an architecture whose ``size_divisor`` does not divide an input size
            of the study axis ``data.input_size`` is appended to it as ``{"unit", "dataset", "architecture",
            "input_size" (px, height), "reason"}`` and gets no run, instead of failing the study (the size may
            suit the other architectures). A size that no architecture of a dataset can run still fails.

    Raises:
        MSBError: a missing layer file, bad YAML, an unknown key (naming its file and the closest valid key),
            a value of the wrong type, or two runs with the same id; an input size not divisible for the
            architecture (:class:`~msb.errors.SizeNotDivisibleError`; with ``exclusions``: only when no
            architecture of the dataset can run that axis value).
    """
    study_path = Path(study_path).resolve()
    spec, root = load_study(study_path)
    glob = load_layer(root / "global.yaml")
    check_keys(glob.data, RunConfig, str(root / "global.yaml"), glob.provenance)
    runs: list[GeneratedRun] = []
    archs = list(spec.architectures)
    unknown = sorted(set(spec.architecture_overrides) - set(archs))
    if unknown:
        raise MSBError(f"{study_path}: key 'architecture_overrides' names {', '.join(unknown)}, not in the study's "
                       f"architectures ({', '.join(archs)})")
    if spec.unavailable_architectures == "exclude":
        archs = _available_architectures(spec, root, study_path, exclusions)
    for kind, names in (("datasets", spec.datasets), ("architectures", archs)):
        for name in names:
            check_config_name(root, kind, name, study_path)
    for ds in spec.datasets:
        failed: dict[str, list[tuple[str, SizeNotDivisibleError]]] = {}  # axis value -> (arch, error)
        ds_layer = load_layer(root / "datasets" / f"{ds}.yaml")
        check_keys(ds_layer.data, RunConfig, str(root / "datasets" / f"{ds}.yaml"), ds_layer.provenance)
        for arch in archs:
            arch_layer = load_layer(root / "architectures" / f"{arch}.yaml")
            check_keys(arch_layer.data, RunConfig, str(root / "architectures" / f"{arch}.yaml"),
                       arch_layer.provenance)
            layers = [ds_layer, arch_layer]
            if spec.recipe == "official":
                official = root / "architectures" / "official" / f"{arch}.yaml"
                if not official.is_file():
                    raise MSBError(f"{study_path}: recipe: official needs {official} (an overlay reproducing the "
                                   f"official scripts of '{arch}'); none exists, use recipe: controlled")
                layers.append(load_layer(official))
                check_keys(layers[-1].data, RunConfig, str(official), layers[-1].provenance)
            prov: Provenance = dict(glob.provenance)
            merged = deep_merge({}, glob.data)
            for layer in layers:
                prov.update(layer.provenance)
                merged = deep_merge(merged, layer.data)
            merged = deep_merge(merged, spec.overrides, f"{study_path} (overrides)", prov)
            if arch in spec.architecture_overrides:
                merged = deep_merge(merged, spec.architecture_overrides[arch],
                                    f"{study_path} (architecture_overrides.{arch})", prov)
            axes = pool_axes(spec.pools, spec.seeds, spec.axes, str(study_path))
            for combo in axis_combinations(axes, str(study_path)):
                try:
                    runs.append(_one_run(spec, study_path, ds, arch, merged, prov, combo))
                except SizeNotDivisibleError as exc:
                    if exclusions is None or "data.input_size" not in combo:
                        raise
                    failed.setdefault(json.dumps(combo["data.input_size"]), []).append((arch, exc))
                    exclusions.append({"unit": f"{ds}-{arch}-{axes_slug(combo)}", "dataset": ds,
                                       "architecture": arch, "input_size": int(combo["data.input_size"][0]),
                                       "reason": f"input size not divisible: {exc}"})
        for value, errs in failed.items():
            if len(errs) == len(archs):  # no architecture can run it: a typo, not an exclusion
                raise errs[0][1]
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise MSBError(f"{study_path}: two runs share one id; list each dataset and architecture once")
    return runs


def _available_architectures(spec: StudySpec, root: Path, study_path: Path,
                             exclusions: list[dict[str, Any]] | None) -> list[str]:
    """``unavailable_architectures: exclude``: the study's architectures that have a config file whose
    ``model.arch`` is registered (or a ``model.target``); each other one is appended to ``exclusions`` once per
    dataset x input size of the ``data.input_size`` axis (``input_size`` -1 without that axis) with the reason.
    The list may be empty (``msb generate`` then writes an empty plan; ``msb run`` refuses it)."""
    from msb.models.registry import available_architectures  # models import torch: only when generating

    registered, keep = set(available_architectures()), []
    sizes = list(spec.axes.get("data.input_size", [])) or [None]
    for arch in spec.architectures:
        f = root / "architectures" / f"{arch}.yaml"
        model = (load_layer(f).data.get("model") or {}) if f.is_file() else {}
        if f.is_file() and (model.get("target") or model.get("arch") in registered):
            keep.append(arch)
            continue
        reason = (f"not available in this installation: no {f}" if not f.is_file() else
                  f"not available in this installation: model.arch {model.get('arch')!r} of {f} is not registered")
        for ds in spec.datasets:
            for size in sizes:
                if exclusions is not None:
                    slug = f"-{axes_slug({'data.input_size': size})}" if size is not None else ""
                    exclusions.append({"unit": f"{ds}-{arch}{slug}", "dataset": ds, "architecture": arch,
                                       "input_size": int(size[0]) if size is not None else -1, "reason": reason})
    return keep


def _one_run(spec: StudySpec, study_path: Path, ds: str, arch: str, merged: dict[str, Any], prov: Provenance,
             combo: dict[str, Any]) -> GeneratedRun:
    """Validate one run config: the merged layers, then the axis values ``combo``, then the study keys."""
    from msb.config.study_spec import params_to_nested

    prov, merged = dict(prov), dict(merged)
    if combo:
        try:
            nested = params_to_nested(combo)
        except ValueError as exc:
            raise MSBError(f"{study_path}: key 'axes': {exc}") from None
        merged = deep_merge(merged, nested, f"{study_path} (axes)", prov)
        params = (merged.get("model") or {}).get("params") or {}
        if "data.input_size" in combo and "img_size" in params and "model.params.img_size" not in combo:
            # an architecture whose input size is baked into the model (G-CASCADE's graph size,
            # model.params.img_size) follows the input-size axis: one run per size
            merged = deep_merge(merged, {"model": {"params": {"img_size": list(combo["data.input_size"])}}},
                                f"{study_path} (axes: data.input_size -> model.params.img_size)", prov)
        merged["axes"] = combo
    if spec.final is not None:  # final.checkpoint / final.test_split set evaluation.* of every run
        ev = {k: v for k, v in (("checkpoint", spec.final.checkpoint), ("split", spec.final.test_split))
              if v is not None}
        merged = deep_merge(merged, {"evaluation": ev} if ev else {}, f"{study_path} (final)", prov)
    merged["study"] = spec.study
    merged["recipe"] = spec.recipe
    if spec.run_root is not None:
        merged["run_root"] = spec.run_root
    cfg = validate_layers(merged, RunConfig, prov, str(study_path))
    _check_model_fits(cfg, prov, str(study_path))  # type: ignore[arg-type]
    h = config_hash(cfg)  # type: ignore[arg-type]
    return GeneratedRun(f"{ds}-{arch}-{h[:8]}", cfg, h, ds, arch)  # type: ignore[arg-type]


def write_run_config(run: GeneratedRun, run_dir: str | Path) -> None:
    """Write ``config.yaml`` and ``config.sha256`` into ``run_dir`` (atomically). If a ``config.sha256`` is
    already there with another hash, raise :class:`MSBError` (the folder belongs to a different config)."""
    run_dir = Path(run_dir)
    existing = run_dir / "config.sha256"
    if existing.is_file() and existing.read_text().strip() != run.config_hash:
        raise MSBError(f"{run_dir}: holds a run with another config hash; use another run_root or delete it")
    atomic_write_text(run_dir / "config.yaml", run_config_to_yaml(run.config))
    atomic_write_text(existing, run.config_hash + "\n")
