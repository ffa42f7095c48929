"""Profile outputs: Parquet + CSV table, a LaTeX table, and an accuracy-vs-cost scatter.

All files are written atomically (:mod:`msb.utils.atomic`). The LaTeX table (booktabs) shows one row per model
x input size x precision; its caption states the timing protocol, the device, the library versions and the
operators the MAC count leaves out, so that it can be pasted into a paper as is.
"""

from __future__ import annotations

import math
from pathlib import Path
import pandas as pd

from msb.errors import MSBError
from msb.utils.atomic import atomic_path, atomic_write_text

__all__ = ["write_profile_table", "render_latex", "plot_accuracy_vs_cost", "PROFILE_BASENAME"]

PROFILE_BASENAME = "profile"

_LATEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                   "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _tex(s: object) -> str:
    return "".join(_LATEX_SPECIALS.get(c, c) for c in str(s))


def _num(v: float, digits: int) -> str:
    return "--" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _one(df: pd.DataFrame, col: str) -> str:
    vals = sorted({str(v) for v in df[col].dropna()})
    return ", ".join(vals) if vals else "--"


def render_latex(df: pd.DataFrame) -> str:
    """LaTeX (booktabs) table of a profile table (columns of :data:`~msb.profiling.measure.PROFILE_COLUMNS`).

    Columns: model, input (H x W), precision, parameters (M), GMACs (per image), latency (ms, median ± SD over
    repeats, per forward pass of one batch), throughput (images/s), peak memory (MiB; CUDA: allocator peak,
    CPU: peak RSS delta). Requires ``\\usepackage{booktabs}``.
    """
    if df.empty:
        raise MSBError("profile table is empty; nothing to write")
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             r"\begin{tabular}{llrrrrrr}", r"\toprule",
             r"Model & Input & Precision & Params (M) & GMACs & Latency (ms) & Throughput (img/s) & "
             r"Peak mem. (MiB) \\", r"\midrule"]
    for _, r in df.iterrows():
        lat = _num(r["latency_ms_median"], 2)
        if not (isinstance(r["latency_ms_sd"], float) and math.isnan(r["latency_ms_sd"])):
            lat += r" $\pm$ " + _num(r["latency_ms_sd"], 2)
        mem = r["peak_mem_mib"] if r["device"] == "cuda" else r["peak_mem_delta_mib"]
        prec = r["precision"] if r["precision"] == "fp32" else f"AMP ({r['amp_dtype']})"
        lines.append(" & ".join([
            _tex(r["model"]), f"{int(r['input_h'])}$\\times${int(r['input_w'])}", _tex(prec),
            _num(r["params_m"], 2), _num(r["gmacs"], 2), lat, _num(r["throughput_ips"], 1), _num(mem, 1),
        ]) + r" \\")
    p = df.iloc[0]
    device = _one(df, "device_name")
    versions = (f"PyTorch {_one(df, 'torch')}, segmentation-models-pytorch {_one(df, 'segmentation_models_pytorch')}"
                f", timm {_one(df, 'timm')}")
    if p["device"] == "cuda":
        versions += (f", CUDA {_one(df, 'cuda_runtime')}, cuDNN {_one(df, 'cudnn_version')}, "
                     f"driver {_one(df, 'driver_version')}; cudnn.benchmark={_one(df, 'cudnn_benchmark')}")
        mem_note = "peak memory: torch.cuda.max\\_memory\\_allocated"
    else:
        versions += f"; {_one(df, 'num_threads')} threads"
        mem_note = "peak memory: peak RSS increase during one forward pass"
    uncounted = sorted({op.strip() for s in df["uncounted_ops"] for op in str(s).split(",") if op.strip()})
    caption = (f"Cost per model on {_tex(device)} ({_tex(versions)}). Batch size {_one(df, 'batch_size')}; "
               f"latency per forward pass (model forward only), median $\\pm$ SD over {_one(df, 'repeats')} repeats "
               f"of {_one(df, 'timed_passes')} timed passes after {_one(df, 'warmup')} warm-up passes; "
               f"throughput = batch size / median latency; {mem_note}. GMACs per image from PyTorch's "
               f"FlopCounterMode (FLOPs/2), which counts convolutions and matrix products only; not counted: "
               f"{_tex(', '.join(uncounted)) or 'none'}.")
    lines += [r"\bottomrule", r"\end{tabular}", r"\caption{" + caption + "}", r"\label{tab:profile}",
              r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_profile_table(df: pd.DataFrame, out_dir: str | Path, basename: str = PROFILE_BASENAME) -> list[Path]:
    """Write ``<basename>.parquet``, ``.csv`` and ``.tex`` into ``out_dir`` (atomically). Returns the paths.

    Raises:
        MSBError: empty table.
    """
    out = Path(out_dir)
    tex = render_latex(df)
    paths = [out / f"{basename}.parquet", out / f"{basename}.csv", out / f"{basename}.tex"]
    with atomic_path(paths[0]) as tmp:
        df.to_parquet(tmp, index=False)
    with atomic_path(paths[1]) as tmp:
        df.to_csv(tmp, index=False)
    atomic_write_text(paths[2], tex)
    return paths


def plot_accuracy_vs_cost(points: pd.DataFrame, out_path: str | Path, x: str = "gmacs",
                          y_label: str = "Dice") -> Path:
    """Scatter of accuracy against cost, one labelled marker per model (colour per dataset).

    Args:
        points: columns ``model``, ``dataset``, ``value`` (accuracy, e.g. Dice in [0, 1]) and ``x``
            (``gmacs`` or ``latency_ms_median``); optional ``input_h``, ``input_w``.
        out_path: PNG file to write (atomically).
        x: cost column.
        y_label: axis label of ``value`` (e.g. ``Dice (image-macro)``).

    Raises:
        MSBError: no points or the cost column is missing.
    """
    if points.empty or x not in points.columns:
        raise MSBError(f"no accuracy/cost pairs to plot (need columns model, dataset, value, {x})")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel = {"gmacs": "GMACs per image (FlopCounterMode)",
              "latency_ms_median": "latency per forward pass (ms, median)"}.get(x, x)
    fig, ax = plt.subplots(figsize=(6.0, 4.2), dpi=150)
    markers = "osD^v<>pP*X"
    for i, (ds, g) in enumerate(points.groupby("dataset", sort=True)):
        ax.scatter(g[x], g["value"], label=str(ds), marker=markers[i % len(markers)], s=36)
        for _, r in g.iterrows():
            ax.annotate(str(r["model"]), (r[x], r["value"]), textcoords="offset points", xytext=(4, 3),
                        fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(y_label)
    ax.grid(True, alpha=0.3)
    if points["dataset"].nunique() > 1:
        ax.legend(title="dataset", fontsize=7)
    fig.tight_layout()
    out_path = Path(out_path)
    with atomic_path(out_path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return out_path

