"""Schema of the ``analysis`` section: the one statistics setting of a study's post-hoc results.

Set in ``configs/global.yaml`` (or a study's ``overrides: {analysis: ...}``); ``msb run`` records the resolved
setting in ``<study>/_study/analysis.json`` and every result derived from the study's counts uses it: the
closing leaderboard of ``msb run``, ``msb reaggregate --compare`` and ``msb report`` (each command may override
``--bootstrap``/``--seed`` for itself, and says so). Like ``notifications`` the section is **excluded from the
run config's dump and hash** (``RunConfig.analysis`` has ``exclude=True``): how results are summarised does not
change what a run computes. docs/analysis.md, "One statistics setting".
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from msb.config.strict import StrictModel

__all__ = ["AnalysisConfig", "COUNT_METRICS"]

#: metrics computed from the stored counts alone (a test family may only name these: the console leaderboard
#: reads counts only, so a family with a boundary metric could not be the same family everywhere)
COUNT_METRICS = ("dice", "iou", "precision", "recall")

_METRIC_LABEL = {"dice": "Dice", "iou": "IoU", "precision": "precision", "recall": "recall"}


class AnalysisConfig(StrictModel):
    """The statistics setting.

    Attributes:
        bootstrap: image-level bootstrap replicates for every CI (0: no CIs).
        level: CI level (0.95: 95 % intervals).
        ci_method: ``percentile`` (the percentile bootstrap, fold-stratified when a system pools folds;
            Efron & Tibshirani 1993, ch. 13).
        seed: seed of the bootstrap draws (one stream per rule; the same seed gives the same replicates).
        test_family: metrics whose pairwise Wilcoxon signed-rank tests (image-macro per-image scores) form one
            multiple-testing family; tests of other metrics (HD95 in the report, IoU/recall under
            ``--compare``) are corrected as families of their own.
        correction: ``bh`` (Benjamini & Hochberg 1995, over every pair x metric of the family) or ``none``.
    """

    bootstrap: int = Field(1000, ge=0)
    level: float = Field(0.95, gt=0, lt=1)
    ci_method: Literal["percentile"] = "percentile"
    seed: int = 0
    test_family: list[str] = Field(default_factory=lambda: ["dice"], min_length=1)
    correction: Literal["bh", "none"] = "bh"

    @field_validator("test_family")
    @classmethod
    def _count_metrics(cls, v: list[str]) -> list[str]:
        bad = [m for m in v if m not in COUNT_METRICS]
        if bad:
            raise ValueError(f"test_family may name {', '.join(COUNT_METRICS)} (metrics of the stored counts), "
                             f"not {', '.join(bad)}")
        if len(set(v)) != len(v):
            raise ValueError("test_family names a metric twice")
        return v

    def describe(self, n_tests: int | None = None) -> str:
        """One line stating the setting, printed with every result, e.g. ``1,000 replicates, seed 0; BH over
        1 test: image-macro Dice`` (``n_tests``: the size of the family in this result, when known)."""
        boot = (f"{self.bootstrap:,} {self.ci_method} bootstrap replicates, level {self.level:g}, seed {self.seed}"
                if self.bootstrap else "no bootstrap")
        fam = ", ".join(_METRIC_LABEL[m] for m in self.test_family)
        corr = "BH" if self.correction == "bh" else "no correction"
        size = f" over {n_tests} test{'s' if n_tests != 1 else ''}" if n_tests is not None else ""
        return f"{boot}; {corr}{size}: image-macro {fam}"
