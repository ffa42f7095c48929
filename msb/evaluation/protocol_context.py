"""The protocol context of an evaluation: which split policy, input size, seed, study variant and test-time
rule produced a counts row (counts schema version 2, ``docs/counts_schema.md``).

These values go into every row, so that rows from different protocols are never pooled or ranked in one
column by accident (``msb.analysis`` refuses to unless asked).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from msb.config.schema import RunConfig

__all__ = ["split_policy_name", "variant_text", "protocol_context"]


def _num(v: float) -> str:
    return f"{v:g}"


def split_policy_name(cfg: RunConfig, run_dir: Path | None = None, external: bool = False) -> str:
    """The named split policy of a run, as a canonical string.

    Args:
        cfg: the run config (``data.split``).
        run_dir: the run folder; its ``fold.json`` (a cross-validation fold run, :mod:`msb.study.crossval`)
            makes the policy ``kfold(k=K,folds=<first 8 hex of the folds.csv SHA-256>)``.
        external: the evaluation is of an external dataset (never seen in training): ``external-only``.

    Returns:
        ``"external-only"``, ``"kfold(k=5,folds=1a2b3c4d)"``, ``"fixed"`` (the ``split`` column of ``index.csv``) or
        ``"random(seed=0,val=0.1,test=0.1,group=group)"`` (``group=none`` when ungrouped).
    """
    if external:
        return "external-only"
    if run_dir is not None and (Path(run_dir) / "fold.json").is_file():
        try:
            info = json.loads((Path(run_dir) / "fold.json").read_text())
        except (OSError, ValueError):
            info = {}
        return f"kfold(k={info.get('k', '?')},folds={str(info.get('folds_sha256', '?'))[:8]})"
    sp = cfg.data.split
    if sp.mode == "fixed":
        return "fixed"
    return (f"random(seed={sp.seed},val={_num(sp.val_fraction)},test={_num(sp.test_fraction)},"
            f"group={sp.group_column or 'none'})")


def variant_text(axes: dict[str, Any]) -> str:
    """``{"data.input_size": [256, 256], "random_seed": 1}`` -> ``"data.input_size=[256,256];random_seed=1"``
    (keys sorted, values as compact JSON); ``""`` for no axes."""
    return ";".join(f"{k}={json.dumps(axes[k], separators=(',', ':'), sort_keys=True)}" for k in sorted(axes))


def protocol_context(cfg: RunConfig, run_dir: Path | None, test_time_rule: str, external: bool = False
                     ) -> dict[str, Any]:
    """The five protocol keys of a counts context (:data:`msb.evaluation.counts.PROTOCOL_DEFAULTS`).

    Args:
        cfg: the run config; run_dir: the run folder (for ``fold.json``); test_time_rule: the model's rule
            turning its outputs into one prediction (``prediction_semantics.json``); external: an external set.

    Returns:
        ``{"split_policy": str, "input_size": int (px, height), "seed": int, "variant": str,
        "test_time_rule": str}``.
    """
    return {"split_policy": split_policy_name(cfg, run_dir, external), "input_size": int(cfg.data.input_size[0]),
            "seed": int(cfg.random_seed), "variant": variant_text(cfg.axes), "test_time_rule": str(test_time_rule)}
