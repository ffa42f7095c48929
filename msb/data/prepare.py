"""Load the prepared dataset a run config names, preparing it from its source on first use."""

from __future__ import annotations

from pathlib import Path

from msb.config.schema import RunConfig
from msb.data.converters.fetch import prepare_from_source
from msb.data.schema import PreparedDataset, load_prepared_dataset
from msb.errors import MSBError
from msb.utils.progress import Logger, no_log

__all__ = ["ensure_dataset"]


def ensure_dataset(cfg: RunConfig, log: Logger = no_log) -> PreparedDataset:
    """Load the prepared dataset at ``data.root``, preparing it first with ``data.prepare`` when absent.

    Args:
        cfg: a run config (``data.root``, ``data.prepare``, ``data.name`` are read).
        log: line logger (the preparation summary is logged).

    Returns:
        The validated :class:`~msb.data.schema.PreparedDataset`.

    Raises:
        MSBError: no ``index.csv`` and no ``data.prepare``; or any validation error of the dataset.
    """
    root = Path(cfg.data.root)
    if not (root / "index.csv").is_file():
        if cfg.data.prepare is None:
            raise MSBError(f"data.root '{root}' holds no index.csv; prepare it with "
                           f"'msb data prepare NAME --source DIR --out {root}' or add data.prepare to the dataset config")
        p = cfg.data.prepare
        log(f"preparing dataset '{cfg.data.name}' with converter '{p.converter}' into {root}")
        report = prepare_from_source(p.converter, p.source, root, **p.options)
        log(report.summary())
    return load_prepared_dataset(root)
