"""Building blocks checked against hand-derived or independently computed values: ViG graph pieces,
SANet's PCS and colour exchange, min-max normalisation, multi-scale sizes, the structure loss."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import scipy.ndimage as ndi
import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import MultiScaleConfig
from msb.engine.losses import structure_loss
from msb.engine.multiscale import scaled_batches, scaled_size
from msb.errors import MSBError
from msb.evaluation.postprocess import minmax_normalise
from msb.models.zoo.graph import Grapher, MRConv, knn_indices, relative_position_bias, sincos_2d_pos_embed
from msb.models.zoo.sanet import colour_exchange, probability_correction


# --- ViG graph -------------------------------------------------------------------------------------------
def test_sincos_embedding_hand_values():
    """dim 4 -> one frequency ω = 1: node (h, w) -> [sin w, cos w, sin h, cos h]; grid 2×2, row-major."""
    e = sincos_2d_pos_embed(4, 2, 2)
    s1, c1 = math.sin(1), math.cos(1)
    expected = np.array([[0, 1, 0, 1], [s1, c1, 0, 1], [0, 1, s1, c1], [s1, c1, s1, c1]])
    np.testing.assert_allclose(e, expected, atol=1e-12)


def test_relative_position_bias_formula_and_chunking():
    """r = 1: B = −2·P·Pᵀ/dim exactly; r = 2: the row-chunked bicubic resize equals one full resize."""
    p = sincos_2d_pos_embed(8, 4, 4)
    b = relative_position_bias(8, 4, 4, r=1)
    np.testing.assert_allclose(b[0].numpy(), -2 * p @ p.T / 8, atol=1e-6)
    full = -F.interpolate(torch.from_numpy(2 * p @ p.T / 8).float()[None, None], size=(16, 4), mode="bicubic",
                          align_corners=False)[0]
    chunked = relative_position_bias(8, 4, 4, r=2, chunk=3)
    assert chunked.shape == (1, 16, 4)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=0)


def test_knn_matches_brute_force():
    """Neighbours of L2-normalised features = argsort of scipy-free brute-force squared distances."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 5, 12, generator=g), torch.randn(2, 5, 7, generator=g)
    idx = knn_indices(x, y, k=3)
    xn = (x / x.norm(dim=1, keepdim=True)).numpy()
    yn = (y / y.norm(dim=1, keepdim=True)).numpy()
    for b in range(2):
        d = ((xn[b].T[:, None, :] - yn[b].T[None, :, :]) ** 2).sum(-1)  # (12, 7)
        np.testing.assert_array_equal(idx[b].numpy(), np.argsort(d, axis=1, kind="stable")[:, :3])


def test_knn_relative_position_can_change_neighbours():
    """A large bias on candidate 0 pushes it out of every node's neighbour list."""
    x = torch.randn(1, 4, 6)
    bias = torch.zeros(1, 6, 6)
    bias[..., 0] = 100.0
    assert (knn_indices(x, x, 3, bias) != 0).all()


def test_mrconv_max_relative_and_interleaving():
    """With conv/BN/activation replaced by identities the output is the interleaved [x, max_j (y_j − x_i)]."""
    m = MRConv(2, 4)
    m.conv, m.norm, m.act = nn.Identity(), nn.Identity(), nn.Identity()
    x = torch.tensor([[[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]]])  # (1, C=2, n=3)
    idx = torch.tensor([[[1, 2], [0, 2], [0, 1]]])
    out = m(x, x, idx)[0]
    # node 0: neighbours 1, 2 -> max(2-1, 3-1) = 2, max(-1-0, 5-0) = 5
    # node 1: neighbours 0, 2 -> max(1-2, 3-2) = 1, max(0+1, 5+1) = 6
    # node 2: neighbours 0, 1 -> max(1-3, 2-3) = -1, max(0-5, -1-5) = -5
    expected = torch.tensor([[1.0, 2.0, 3.0], [2.0, 1.0, -1.0], [0.0, -1.0, 5.0], [5.0, 6.0, -5.0]])
    torch.testing.assert_close(out, expected)


def test_grapher_refuses_other_grid_and_too_small_graph():
    g = Grapher(8, (4, 4), k=3, reduce_ratio=2)
    assert g(torch.randn(2, 8, 4, 4)).shape == (2, 8, 4, 4)
    with pytest.raises(MSBError, match="built for a 4x4 feature grid but got 8x8"):
        g(torch.randn(1, 8, 8, 8))
    with pytest.raises(MSBError, match=r"has 4 candidate node\(s\) after 2x2 pooling, fewer than k=5x1"):
        Grapher(8, (4, 4), k=5, reduce_ratio=2)


# --- SANet -----------------------------------------------------------------------------------------------
def test_pcs_hand_values():
    """Logits [[2, −1], [−3, 0]]: 1/4 positive, 2/4 negative -> [[8, −2], [−6, 0]] (sign, hence the 0.5 mask,
    unchanged)."""
    z = torch.tensor([[[[2.0, -1.0], [-3.0, 0.0]]]])
    torch.testing.assert_close(probability_correction(z), torch.tensor([[[[8.0, -2.0], [-6.0, 0.0]]]]))


def test_colour_exchange_matches_donor_lab_statistics():
    """Each exchanged image has (up to 8-bit rounding and clipping) the donor's per-channel LAB mean/std,
    computed independently with OpenCV; the masks are untouched; one image is returned unchanged."""
    rng = np.random.default_rng(0)
    imgs = np.stack([np.clip(rng.normal(m, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
                     for m in ((90, 60, 50), (150, 140, 160))])
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x = (torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) \
        / torch.tensor(std).view(1, 3, 1, 1)
    out = colour_exchange(x, mean, std, torch.Generator().manual_seed(0))
    rgb = np.round(((out * torch.tensor(std).view(1, 3, 1, 1) + torch.tensor(mean).view(1, 3, 1, 1)) * 255)
                   .permute(0, 2, 3, 1).numpy()).clip(0, 255).astype(np.uint8)
    for i, donor in ((0, 1), (1, 0)):  # two images: the donor is always the other one
        lab_out = cv2.cvtColor(rgb[i], cv2.COLOR_RGB2LAB).astype(np.float64)
        lab_donor = cv2.cvtColor(imgs[donor], cv2.COLOR_RGB2LAB).astype(np.float64)
        np.testing.assert_allclose(lab_out.mean((0, 1)), lab_donor.mean((0, 1)), atol=2.5)
        np.testing.assert_allclose(lab_out.std((0, 1)), lab_donor.std((0, 1)), atol=2.5)
    assert torch.equal(colour_exchange(x[:1], mean, std, torch.Generator()), x[:1])


# --- evaluation / multi-scale ------------------------------------------------------------------------------
def test_minmax_hand_values():
    p = torch.tensor([[[[0.1, 0.2], [0.3, 0.5]]]])
    expected = torch.tensor([[[[0.0, 0.25], [0.5, 1.0]]]])
    torch.testing.assert_close(minmax_normalise(p), expected, atol=1e-6, rtol=0)
    # an image with no confident pixel still gets a "positive" region at 0.5
    low = torch.tensor([[[[0.01, 0.02], [0.03, 0.04]]]])
    assert int((minmax_normalise(low) >= 0.5).sum()) == 2


def test_scaled_sizes_of_the_polyp_recipe():
    """352 px: 0.75 -> 256 (8.25 -> 8), 1.25 -> 448 (13.75 -> 14); SANet's rates -> 256/288/320/352."""
    assert scaled_size((352, 352), 0.75) == (256, 256)
    assert scaled_size((352, 352), 1.25) == (448, 448)
    assert [scaled_size((352, 352), r)[0] for r in (0.7273, 0.8182, 0.9091, 1.0)] == [256, 288, 320, 352]
    assert scaled_size((64, 96), 0.75) == (64, 64)  # 1.5 -> 2 (half to even), 2.25 -> 2


def test_scaled_batches_soft_and_hard_masks():
    y = torch.zeros(1, 1, 64, 64)
    y[..., 16:48, 16:48] = 1
    x = torch.randn(1, 3, 64, 64)
    cfg = MultiScaleConfig(rates=[0.5, 1.0], soft_masks=True)
    out = scaled_batches(x, y, cfg, torch.Generator())
    assert [tuple(b[0].shape[-2:]) for b in out] == [(32, 32), (64, 64)]
    assert out[1][0] is x  # rate 1: unchanged
    soft = out[0][1]
    assert ((soft > 0) & (soft < 1)).any()  # bilinear: soft boundary values
    hard = scaled_batches(x, y, cfg.model_copy(update={"soft_masks": False}), torch.Generator())[0][1]
    assert set(hard.unique().tolist()) <= {0.0, 1.0}


def test_random_rate_sampling_follows_probabilities():
    """One rate per batch; a rate of probability 0 is never drawn; rates drawn with p = .1/.2/.3/.4 over 4000
    batches lie within 4 standard deviations of the expected counts."""
    x, y = torch.zeros(1, 3, 64, 64), torch.zeros(1, 1, 64, 64)
    g = torch.Generator().manual_seed(0)
    never = MultiScaleConfig(rates=[0.5, 1.0], sampling="random", probabilities=[0.0, 1.0])
    for _ in range(20):
        out = scaled_batches(x, y, never, g)
        assert len(out) == 1 and out[0][0].shape[-1] == 64
    cfg = MultiScaleConfig(rates=[0.25, 0.5, 0.75, 1.0], sampling="random", probabilities=[0.1, 0.2, 0.3, 0.4],
                           size_multiple=4)
    sizes = [scaled_batches(torch.zeros(1, 1, 16, 16), torch.zeros(1, 1, 16, 16), cfg, g)[0][0].shape[-1]
             for _ in range(4000)]
    for size, p in zip((4, 8, 12, 16), (0.1, 0.2, 0.3, 0.4)):
        assert abs(sizes.count(size) - 4000 * p) < 4 * math.sqrt(4000 * p * (1 - p))
    with pytest.raises(ValueError, match="needs multiscale.probabilities"):
        MultiScaleConfig(rates=[0.5, 1.0], sampling="random")
    with pytest.raises(ValueError, match="summing to 1"):
        MultiScaleConfig(rates=[0.5, 1.0], probabilities=[0.5, 0.6])


# --- structure loss ------------------------------------------------------------------------------------------
def _structure_numpy(z: np.ndarray, y: np.ndarray, weighted: bool) -> float:
    """Independent NumPy/SciPy structure loss for one (H, W) map: 31×31 zero-padded mean filter
    (count_include_pad), BCE weighted or plain mean (the reference's legacy reduce='none' = mean)."""
    w = 1 + 5 * np.abs(ndi.uniform_filter(y, size=31, mode="constant", cval=0.0) - y)
    bce = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    wbce = (w * bce).sum() / w.sum() if weighted else bce.mean()
    p = 1 / (1 + np.exp(-z))
    inter = (p * y * w).sum()
    union = ((p + y) * w).sum()
    return float(wbce + 1 - (inter + 1) / (union - inter + 1))


def test_structure_loss_against_independent_reference_both_modes():
    """Both ``bce_weighting`` modes equal the independent formula, and they differ (by > 1e-3 here) because the
    boundary weight acts on BCE only in the ``weighted`` (published) mode."""
    rng = np.random.default_rng(1)
    y = np.zeros((48, 48))
    y[10:30, 12:40] = 1
    z = rng.normal(0, 2, (48, 48))
    zt, yt = torch.from_numpy(z)[None, None], torch.from_numpy(y)[None, None]
    for mode, weighted in (("weighted", True), ("reference", False)):
        assert float(structure_loss(zt, yt, mode)) == pytest.approx(_structure_numpy(z, y, weighted), abs=1e-9)
    assert abs(float(structure_loss(zt, yt, "weighted")) - float(structure_loss(zt, yt, "reference"))) > 1e-3
