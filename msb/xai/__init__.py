"""Explainability stage (``msb explain``): Grad-CAM overlays per run (fold) and the fold average.

Reads run folders only (``config.yaml``, SHA-256-verified checkpoints, ``split.csv``) and the prepared dataset;
it never imports training code. See ``docs/explain.md``.
"""

from msb.xai.explain import EXPLAIN_COLUMNS, ExplainOutputs, explain, preprocess_image
from msb.xai.gradcam import CamResult, grad_cam
from msb.xai.layers import DEFAULT_TARGET_LAYERS, resolve_layer
from msb.xai.runs import ExplainRun, RunSelection, find_runs, group_runs

__all__ = ["EXPLAIN_COLUMNS", "ExplainOutputs", "explain", "preprocess_image", "CamResult", "grad_cam",
           "DEFAULT_TARGET_LAYERS", "resolve_layer", "ExplainRun", "RunSelection", "find_runs", "group_runs"]
