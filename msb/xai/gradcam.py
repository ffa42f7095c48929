"""Grad-CAM for segmentation (Selvaraju et al., ICCV 2017), through the ``grad-cam`` package.

For a target layer with activations ``A_k`` (channel k) and the scalar score ``y`` =
sum of the class-c test-time logits over a pixel region M (``pytorch_grad_cam.utils.model_targets.
SemanticSegmentationTarget``), Grad-CAM is ``ReLU(sum_k alpha_k A_k)`` with ``alpha_k`` = the spatial mean of
``dy/dA_k``; the package rescales it to the input size (``cv2.resize``, bilinear) and min-max normalises it to
[0, 1] per image (``scale_cam_image``). M is the **predicted foreground** of class c (the test-time
prediction at the threshold of the run's config); when the prediction is empty, M is the whole image (the
result records which).

The explained output is the model's test-time logit map (:meth:`~msb.models.base.Segmentor.predict_logits`:
all outputs combined by the architecture's test-time rule), so deep-supervision heads count as they count at
test time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from msb.xai.layers import resolve_layer

__all__ = ["CamResult", "TestTimeLogits", "grad_cam"]


class TestTimeLogits(nn.Module):
    """Wraps a Segmentor so that ``forward(x)`` returns its test-time logits (N, C, H, W) at the input size
    (what ``grad-cam`` expects: one tensor)."""

    def __init__(self, segmentor: nn.Module) -> None:
        super().__init__()
        self.segmentor = segmentor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self.segmentor, "predict_logits"):
            return self.segmentor.predict_logits(x)
        out = self.segmentor(x)
        return out[0] if isinstance(out, (list, tuple)) else out


@dataclass
class CamResult:
    """Grad-CAM of one image for every foreground class.

    Attributes:
        cam: float32 (C, H, W) in [0, 1] at the model input size (H, W).
        logits: float32 (C, H, W) test-time logits at the input size (no gradient).
        region: per class, ``"predicted foreground"`` or ``"whole image (empty prediction)"``.
    """

    cam: np.ndarray
    logits: np.ndarray
    region: list[str]


def grad_cam(model: nn.Module, x: torch.Tensor, layer_names: Sequence[str], masks: np.ndarray | None = None,
             threshold: float = 0.5, threshold_on: str = "probability") -> CamResult:
    """Grad-CAM of ``model`` for one input image, one map per foreground class.

    Args:
        model: a Segmentor (or any module whose forward gives logits or a list of them); set to eval mode.
        x: float32 (1, 3, H, W), normalised like the training inputs.
        layer_names: target layer paths (:func:`~msb.xai.layers.resolve_layer`).
        masks: optional bool (C, H, W) target regions; default: the predicted foreground
            (``sigmoid(logits) >= threshold`` or ``logits >= threshold``), the whole image where it is empty.
        threshold, threshold_on: the run's binarisation (``evaluation.threshold``/``threshold_on``).

    Returns:
        :class:`CamResult`.

    Raises:
        MSBError: a layer path that does not resolve.
    """
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import SemanticSegmentationTarget

    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"grad_cam expects one image (1, 3, H, W), got {tuple(x.shape)}")
    model.eval()
    wrapped = TestTimeLogits(model).eval()
    layers = [resolve_layer(model, n) for n in layer_names]
    with torch.no_grad():
        logits_t = wrapped(x)[0].float().cpu()  # (C, H, W)
    logits = logits_t.numpy()
    if masks is None:
        masks = (torch.sigmoid(logits_t) >= threshold if threshold_on == "probability"
                 else logits_t >= threshold).numpy()
    regions, cams = [], []
    cam = GradCAM(model=wrapped, target_layers=layers)
    try:
        for c in range(logits.shape[0]):
            m = np.asarray(masks[c], dtype=bool)
            if m.any():
                regions.append("predicted foreground")
            else:
                regions.append("whole image (empty prediction)")
                m = np.ones_like(m)
            out = cam(input_tensor=x, targets=[SemanticSegmentationTarget(c, m.astype(np.float32))])
            cams.append(np.clip(out[0], 0.0, 1.0).astype(np.float32))
    finally:
        cam.activations_and_grads.release()
    model.zero_grad(set_to_none=True)
    return CamResult(np.stack(cams), logits.astype(np.float32), regions)
