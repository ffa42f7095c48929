"""The ``msb profile`` pipeline: choose targets, measure, write the tables and (for a study) the scatter."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.registry import available_architectures
from msb.profiling.environment import resolve_profile_device
from msb.profiling.measure import ProfileTarget, profile_targets
from msb.profiling.report import plot_accuracy_vs_cost, write_profile_table
from msb.profiling.study import accuracy_vs_cost, find_study_runs, study_accuracy, targets_from_study
from msb.profiling.timing import TimingProtocol
from msb.utils.atomic import atomic_path

__all__ = ["ProfileOutputs", "run_profile", "DEFAULT_SIZE"]

#: Input size (pixels, square) when neither ``--input-size`` nor a study gives one.
DEFAULT_SIZE = 256


@dataclass
class ProfileOutputs:
    """What :func:`run_profile` measured and wrote."""

    table: pd.DataFrame
    paths: list[Path] = field(default_factory=list)
    points: pd.DataFrame | None = None


def run_profile(device: str, archs: Sequence[str] = (), study: str | Path | None = None,
                sizes: Sequence[tuple[int, int]] = (), protocols: Sequence[TimingProtocol] = (TimingProtocol(),),
                out_dir: str | Path | None = None, num_classes: int = 1, role: str = "best",
                rule: str = "image-macro", x_axis: str = "gmacs",
                log: Callable[[str], None] = lambda m: None,
                model_configs: Mapping[str, ModelConfig] | None = None) -> ProfileOutputs:
    """Profile architectures (``archs``; all registered ones when empty and no ``study``) or the models of a
    study, and write ``profile_<device>.{parquet,csv,tex}`` (plus ``accuracy_vs_cost_<device>.{png,csv}`` for a
    study) into ``out_dir`` (default ``<study>/profile`` or ``profiles``).

    Args:
        device: ``cpu`` or ``cuda`` (checked first: a missing GPU fails before anything is built).
        archs: architecture config names (keys of ``model_configs``, e.g. ``unet_r18``: the model a study
            naming it trains) or registry names (built with the adapter's default arguments).
        study: a study folder ``runs/<study>/`` (exclusive with ``archs``).
        sizes: (height, width) input sizes in pixels; default 256 x 256 without a study, the runs' training
            sizes with one (sizes given are added to those).
        protocols: timing protocols (e.g. one per precision).
        num_classes: output channels for ``archs`` (a study's runs use their dataset's class count).
        role, rule: checkpoint role and aggregation rule of the study's Dice.
        x_axis: ``gmacs`` or ``latency`` for the scatter.
        model_configs: ``{config name: ModelConfig}`` of the architecture configs
            (:func:`msb.cli.catalog.architecture_model_configs`); with no ``archs`` all of them are profiled
            (all registry names when empty).

    Raises:
        MSBError: ``--device cuda`` without a GPU; both ``archs`` and ``study``; an unknown architecture; an
            input size the model cannot take; a study without runs or counts.
    """
    dev = resolve_profile_device(device)
    if archs and study is not None:
        raise MSBError("give either --arch or --study, not both")
    if x_axis not in ("gmacs", "latency"):
        raise MSBError(f"--x must be gmacs or latency, not '{x_axis}'")
    if num_classes < 1:
        raise MSBError(f"--num-classes must be >= 1, not {num_classes}")
    acc = None
    if study is not None:
        runs = find_study_runs(study, log)
        acc = study_accuracy(runs, role=role, rule=rule)  # before measuring: fail early without counts
        targets = targets_from_study(runs)
        out = Path(out_dir) if out_dir is not None else Path(study) / "profile"
    else:
        configs = dict(model_configs or {})
        names = list(archs) or list(configs) or available_architectures()
        known = list(configs) + [a for a in available_architectures() if a not in configs]
        for n in names:
            if n not in known:
                import difflib

                close = difflib.get_close_matches(n, known, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise MSBError(f"--arch: unknown architecture '{n}'{hint} (architecture configs: "
                               f"{', '.join(configs) or 'none'}; registry adapters: {', '.join(available_architectures())})")
        targets = [ProfileTarget(n, configs.get(n) or ModelConfig(arch=n), num_classes) for n in names]
        sizes = list(sizes) or [(DEFAULT_SIZE, DEFAULT_SIZE)]
        out = Path(out_dir) if out_dir is not None else Path("profiles")
    table = profile_targets(targets, sizes, dev, protocols, log)
    paths = write_profile_table(table, out, f"profile_{dev.type}")
    points = None
    if acc is not None:
        points = accuracy_vs_cost(acc, table, precision=protocols[0].precision)
        if points.empty:
            log("no profiled model matches the study's counts; scatter not written")
        else:
            col = "gmacs" if x_axis == "gmacs" else "latency_ms_median"
            png = plot_accuracy_vs_cost(points, out / f"accuracy_vs_cost_{dev.type}.png", x=col,
                                        y_label=f"Dice ({rule}, {role} checkpoint)")
            csv = out / f"accuracy_vs_cost_{dev.type}.csv"
            with atomic_path(csv) as tmp:
                points.to_csv(tmp, index=False)
            paths += [png, csv]
    return ProfileOutputs(table, paths, points)
