"""Configuration of the boundary, lesion and legacy metrics (``evaluation.metrics`` in the run config).

Every field is recorded with the values it produces (the metrics table carries the convention names,
tolerance unit and connectivities in its columns), so two tables computed under different settings can
never be mistaken for each other. See ``docs/metrics.md`` for the formulas and the empty-mask policy.
"""

from __future__ import annotations

from typing import Any, List, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from msb.config.strict import StrictModel

HDConvention = Literal["metrics_reloaded", "monai", "medpy", "surface_distance"]
"""Named conventions for HD / HD95 / ASSD / MASD (see ``msb.evaluation.surface.CONVENTIONS``)."""

NSDConvention = Literal["metrics_reloaded", "surface_distance"]
"""Named conventions for the normalised surface distance (surface Dice)."""

LesionCriterion = Literal["any_overlap", "centroid_in_reference", "iou"]
"""Lesion matching rules (see ``msb.evaluation.lesion``)."""


class MetricsConfig(StrictModel):
    """Settings of the per image x class boundary/lesion metric engine.

    Attributes:
        hd_convention: how HD, HD95, ASSD and MASD are computed from the boundary distances.
            ``metrics_reloaded`` (default) and ``monai``: HD95 = max of the two directed 95th percentiles
            (MetricsReloaded ``measured_hausdorff_distance_perc``, MONAI ``compute_hausdorff_distance``);
            ``medpy``: HD95 = 95th percentile of the pooled distances of both directions (medpy ``hd95``);
            ``surface_distance``: DeepMind surface-distance, contour-length weighted, on pixel-corner
            contours. Default reason: the max of the directed percentiles cannot be diluted by the boundary
            size of the other mask, so an error on one side only (missed lesion, far false alarm) is not
            hidden; it is what the Metrics Reloaded recommendations and MONAI compute.
        nsd_convention: ``metrics_reloaded`` (default; boundary-pixel counts, equal to MONAI
            ``compute_surface_dice``) or ``surface_distance`` (DeepMind ``compute_surface_dice_at_tolerance``,
            contour-length weighted; equal to MONAI ``use_subvoxels=True``).
        nsd_tolerances: NSD tolerances tau (> 0), in ``tolerance_unit``; one column per tolerance.
        tolerance_unit: ``px`` (default): tau is a distance in pixels (distances measured with unit spacing),
            which is meaningful for 2D images without a physical spacing; ``mm``: tau is in the units of the
            pixel spacing (``spacing_row``, ``spacing_col`` of ``index.csv``, default 1).
        connectivity: boundary rule: boundary = mask AND NOT erosion(mask) with the 4-neighbourhood (cross,
            default, used by medpy, MONAI and MetricsReloaded) or the 8-neighbourhood (3x3 square).
            Ignored by the ``surface_distance`` conventions (contours from 2x2 neighbour codes).
        lesion_connectivity: connectivity of lesion components (8 = default, diagonal pixels join).
        lesion_criteria: matching rules to report (each adds TP/FP/FN, sensitivity, precision and F1).
        lesion_iou_threshold: threshold t of the ``iou`` rule: a one-to-one pair matches when IoU >= t.
        min_lesion_area: components (on both sides) with fewer pixels are ignored by the lesion metrics
            (0 = keep all).
        legacy: also compute the PraNet-template legacy metrics (S-measure, weighted F, E-measure, MAE and
            the threshold-averaged "mDice") from the stored probability maps. Not comparable with Dice.
        card: also compute a published evaluation card's scoring recipe as written
            (``card_dice_as_written``, ``card_iou_as_written``, ``card_hd95_as_written``;
            ``msb.evaluation.card_metrics``), beside the real HD95 of ``hd_convention``. Its "HD95" is the
            distance to the farthest reference pixel, not a Hausdorff distance. Left out of ``config.yaml``
            (and the config hash) while false, so existing run ids do not change.
    """

    model_config = ConfigDict(extra="forbid")

    hd_convention: HDConvention = "metrics_reloaded"
    nsd_convention: NSDConvention = "metrics_reloaded"
    nsd_tolerances: List[float] = Field(default_factory=lambda: [1.0, 2.0, 5.0])
    tolerance_unit: Literal["px", "mm"] = "px"
    connectivity: Literal[4, 8] = 4
    lesion_connectivity: Literal[4, 8] = 8
    lesion_criteria: List[LesionCriterion] = Field(
        default_factory=lambda: ["any_overlap", "centroid_in_reference", "iou"])
    lesion_iou_threshold: float = Field(default=0.5, gt=0.0, le=1.0)
    min_lesion_area: int = Field(default=0, ge=0)
    legacy: bool = False
    card: bool = False

    @model_serializer(mode="wrap")
    def _omit_default_card(self, handler: Any) -> dict[str, Any]:
        """Dump without ``card`` while it is false (config hashes stay as they were)."""
        data = handler(self)
        if isinstance(data, dict) and not self.card:
            data.pop("card", None)
        return data

    @field_validator("nsd_tolerances")
    @classmethod
    def _check_tolerances(cls, value: List[float]) -> List[float]:
        if not value:
            raise ValueError("nsd_tolerances must list at least one tolerance (e.g. [1.0, 2.0])")
        if any(not (t > 0) or t == float("inf") for t in value):
            raise ValueError(f"nsd_tolerances must be finite and > 0, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"nsd_tolerances must not repeat a value, got {value}")
        return [float(t) for t in value]

    @field_validator("lesion_criteria")
    @classmethod
    def _check_criteria(cls, value: List[str]) -> List[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lesion_criteria must not repeat a rule, got {value}")
        return value
