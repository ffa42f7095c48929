"""Hand-computable boundary-distance cases; every expected value is derived in the docstring."""

from __future__ import annotations

import math

import numpy as np
import pytest

from msb.config.metrics_schema import MetricsConfig
from msb.evaluation import surface
from msb.evaluation.image_metrics import compute_image_metrics

PIXEL_CONVENTIONS = ("metrics_reloaded", "monai", "medpy")


def _square(shape, r0, c0, size=3):
    m = np.zeros(shape, bool)
    m[r0:r0 + size, c0:c0 + size] = True
    return m


def _cfg(**kw):
    base = dict(nsd_tolerances=[0.5, 1.0], tolerance_unit="px")
    base.update(kw)
    return MetricsConfig(**base)


def test_boundary_rule_cross_and_square():
    """Boundary = mask AND NOT erosion. A 3x3 square: only its centre has all 4 (and all 8) neighbours
    inside, so both rules give the 8 ring pixels. A plus sign (centre + 4 arms): with the cross the centre
    is interior (4 boundary pixels); with the 3x3 square the centre's diagonal neighbours are outside, so
    all 5 pixels are boundary. Pixels on the image edge are boundary (outside = background): a full 3x3
    image has 8 boundary pixels."""
    sq = _square((7, 7), 2, 2)
    assert surface.boundary(sq, 4).sum() == 8 and not surface.boundary(sq, 4)[3, 3]
    assert surface.boundary(sq, 8).sum() == 8
    plus = np.zeros((5, 5), bool)
    plus[2, 1:4] = True
    plus[1:4, 2] = True
    assert surface.boundary(plus, 4).sum() == 4 and not surface.boundary(plus, 4)[2, 2]
    assert surface.boundary(plus, 8).sum() == 5
    assert surface.boundary(np.ones((3, 3), bool), 4).sum() == 8


@pytest.mark.parametrize("method", ["kdtree", "edt"])
@pytest.mark.parametrize("convention", PIXEL_CONVENTIONS)
def test_one_pixel_shift_of_a_square(convention, method):
    """3x3 squares, the prediction one column left of the reference (pred cols 2-4, ref cols 3-5).

    Each boundary is the 8-pixel ring. P->R: the ring pixels in cols 3-4 of the top and bottom rows lie on
    the reference ring (0): (2,3),(2,4),(4,3),(4,4); the other four ((2,2),(3,2),(4,2),(3,4)) are 1 px
    from it -> four 0 and four 1. R->P symmetric. So HD = 1; pooled P95 of 8 zeros + 8 ones: position
    0.95*15 = 14.25 -> 1; directed P95: position 0.95*7 = 6.65 in [0,0,0,0,1,1,1,1] -> 1. ASSD = MASD = 0.5.
    NSD(tau=1) = 16/16 = 1; NSD(tau=0.5) = 8/16 = 0.5.
    """
    pred, ref = _square((8, 9), 2, 2), _square((8, 9), 2, 3)
    sd = surface.surface_distances(pred, ref, method=method)
    assert sorted(sd.pred_to_ref.tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sorted(sd.ref_to_pred.tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    m = compute_image_metrics(pred, ref, config=_cfg(hd_convention=convention))
    assert (m["hd"], m["hd95"], m["assd"], m["masd"]) == (1.0, 1.0, 0.5, 0.5)
    assert m["nsd_tau1px"] == 1.0 and m["nsd_tau0.5px"] == 0.5
    assert m["hd_convention"] == convention


@pytest.mark.parametrize("convention", PIXEL_CONVENTIONS)
def test_single_pixels(convention):
    """Single pixels: a one-pixel mask is its own boundary. Same place -> every distance 0, NSD 1.
    Offset (3, 4) rows/cols -> the only distance is sqrt(9 + 16) = 5 in every direction, so HD = HD95 =
    ASSD = MASD = 5. With spacing (2, 0.5): sqrt((3*2)^2 + (4*0.5)^2) = sqrt(40) = 6.32455532."""
    a = np.zeros((10, 10), bool)
    a[2, 2] = True
    b = np.zeros((10, 10), bool)
    b[5, 6] = True
    same = compute_image_metrics(a, a, config=_cfg(hd_convention=convention))
    assert (same["hd"], same["hd95"], same["assd"], same["nsd_tau0.5px"]) == (0.0, 0.0, 0.0, 1.0)
    m = compute_image_metrics(a, b, config=_cfg(hd_convention=convention))
    assert (m["hd"], m["hd95"], m["assd"], m["masd"]) == (5.0, 5.0, 5.0, 5.0)
    m = compute_image_metrics(a, b, spacing=(2.0, 0.5), config=_cfg(hd_convention=convention))
    for key in ("hd", "hd95", "assd", "masd"):
        assert m[key] == pytest.approx(math.sqrt(40.0), abs=1e-12)


def test_two_blobs_one_missed_separates_the_conventions():
    """Reference = 3x3 square A (rows 1-3, cols 1-3) + one pixel B at (2, 13); prediction = A only.

    P->R: the 8 ring pixels of A lie on the reference ring -> 8 zeros. R->P: A's ring -> 8 zeros; B's
    nearest predicted boundary pixel is (2, 3) -> 10. Hence
    * HD = 10.
    * medpy (pooled, 17 values = 16 zeros + 10): position 0.95*16 = 15.2 -> 0 + 0.2*10 = 2.0.
    * MetricsReloaded/MONAI (directed): R->P has 9 values, position 0.95*8 = 7.6 -> 0 + 0.6*10 = 6.0;
      P->R = 0; max = 6.0.
    * ASSD (pooled mean) = 10/17 = 0.58823529...; MASD = (10/9 + 0)/2 = 0.55555...
    * NSD(tau=1) = 16/17 (every distance but the 10 is 0).
    * Lesions (any overlap): 2 reference lesions, 1 found -> TP 1, FN 1, FP 0: sensitivity 0.5,
      precision 1, F1 = 2*0.5*1/1.5 = 2/3.
    """
    ref = _square((6, 16), 1, 1)
    ref[2, 13] = True
    pred = _square((6, 16), 1, 1)
    mp = compute_image_metrics(pred, ref, config=_cfg(hd_convention="medpy"))
    mr = compute_image_metrics(pred, ref, config=_cfg(hd_convention="metrics_reloaded"))
    assert mp["hd"] == mr["hd"] == 10.0
    assert mp["hd95"] == pytest.approx(2.0, abs=1e-12)
    assert mr["hd95"] == pytest.approx(6.0, abs=1e-12)
    assert mr["assd"] == pytest.approx(10 / 17, abs=1e-12)
    assert mr["masd"] == pytest.approx(5 / 9, abs=1e-12)
    assert mr["nsd_tau1px"] == pytest.approx(16 / 17, abs=1e-12)
    assert (mr["lesion_any_overlap_tp"], mr["lesion_any_overlap_fn"], mr["lesion_any_overlap_fp"]) == (1, 1, 0)
    assert mr["lesion_any_overlap_f1"] == pytest.approx(2 / 3, abs=1e-12)


def test_contour_convention_single_pixels_three_apart():
    """DeepMind contours of a single pixel: its 4 corners, each with a one-bit neighbour code, so each is a
    diagonal piece of length 0.5*sqrt(2). Pixels 3 columns apart: the predicted right corners are 2 from the
    reference left corners and the predicted left corners 3 away -> distances [2, 2, 3, 3] per direction,
    equal weights. ASD = 2.5; HD = 3; HD95: cumulative fractions [.25, .5, .75, 1], first >= 0.95 is index
    3 -> 3; NSD(tau=2) = 4/8 = 0.5 (the boundary-pixel NSD is 0: the only distance is 3 > 2)."""
    a = np.zeros((5, 9), bool)
    a[2, 2] = True
    b = np.zeros((5, 9), bool)
    b[2, 5] = True
    sd = surface.surface_distances(a, b, boundary_model="contours")
    assert sorted(sd.pred_to_ref.tolist()) == [2.0, 2.0, 3.0, 3.0]
    assert np.allclose(sd.pred_weights, 0.5 * math.sqrt(2))
    m = surface.distance_metrics(sd, "surface_distance")
    assert (m["hd"], m["hd95"], m["assd"]) == (3.0, 3.0, 2.5)
    assert surface.nsd(sd, 2.0) == 0.5
    assert surface.nsd(surface.surface_distances(a, b), 2.0) == 0.0


def test_contour_length_table_anisotropic():
    """Spacing (2, 1): vertical piece = 2, horizontal = 1, diagonal = 0.5*sqrt(4 + 1) = 1.1180339887,
    two-diagonal (codes 6, 9) = sqrt(5); codes 0 and 15 have no contour."""
    t = surface.contour_length_table((2.0, 1.0))
    assert t[0] == t[15] == 0.0
    assert t[5] == t[10] == 2.0 and t[3] == t[12] == 1.0
    assert t[1] == pytest.approx(0.5 * math.sqrt(5)) and t[6] == pytest.approx(math.sqrt(5))


def test_nsd_tolerance_unit_px_vs_mm():
    """Single pixels one row apart with spacing (2, 2): the distance is 1 px = 2 mm. tau = 1 px -> within
    tolerance (NSD 1); tau = 1 mm -> not (NSD 0); tau = 2 mm -> 1. HD is always in mm: 2."""
    a = np.zeros((6, 6), bool)
    a[2, 2] = True
    b = np.zeros((6, 6), bool)
    b[3, 2] = True
    px = compute_image_metrics(a, b, spacing=(2.0, 2.0), config=MetricsConfig(nsd_tolerances=[1.0]))
    mm = compute_image_metrics(a, b, spacing=(2.0, 2.0),
                               config=MetricsConfig(nsd_tolerances=[1.0, 2.0], tolerance_unit="mm"))
    assert px["nsd_tau1px"] == 1.0 and px["hd"] == 2.0
    assert mm["nsd_tau1mm"] == 0.0 and mm["nsd_tau2mm"] == 1.0


def test_crop_keeps_image_edge_rule():
    """Objects touching the image edge: the crop's zero margin must reproduce "outside = background".
    Prediction = first 2 rows of a 6x6 image, reference = first 3 rows. Boundary of the prediction: both
    rows (row 0 touches the edge, row 1 borders row 2) -> 12 pixels; of the reference: rows 0 and 2 plus
    the edge columns of row 1 -> 6 + 6 + 2 = 14. P->R: row 0 -> 0, row 1 -> 1 except its two edge pixels
    (on the reference boundary) -> sum 4; R->P: row 0 -> 0, row 2 -> 1 (6), row-1 edge pixels -> 0 -> sum 6.
    ASSD = (4 + 6) / 26 = 0.384615..."""
    pred = np.zeros((6, 6), bool)
    pred[:2] = True
    ref = np.zeros((6, 6), bool)
    ref[:3] = True
    sd = surface.surface_distances(pred, ref)
    assert (sd.n_pred, sd.n_ref) == (12, 14)
    assert surface.distance_metrics(sd, "medpy")["assd"] == pytest.approx(10 / 26, abs=1e-12)


def test_bad_inputs_raise():
    """Shape mismatch, non-2D input, non-positive spacing and unknown convention are rejected."""
    a = np.zeros((4, 4), bool)
    with pytest.raises(ValueError):
        surface.surface_distances(a, np.zeros((4, 5), bool))
    with pytest.raises(ValueError):
        surface.surface_distances(a, a, spacing=(0.0, 1.0))
    with pytest.raises(ValueError):
        surface.distance_metrics(surface.surface_distances(a, a), "hausdorff_by_feel")
    with pytest.raises(ValueError):
        compute_image_metrics(np.zeros((2, 4, 4), bool), np.zeros((2, 4, 4), bool))
