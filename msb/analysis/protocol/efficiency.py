"""(c) Model-only inference efficiency at batch size 1, the MSB paper's Table 3 (MedSegBenchmarker, §4.2
"Inference Efficiency"), from the profile tables ``msb profile --study`` writes (``<study>/profile/
profile_<device>.parquet``, columns :data:`msb.profiling.measure.PROFILE_COLUMNS`; docs/profiling.md).

Rows: architectures (the profile's ``model`` label); columns: ``Param (M)``, then per input size ``GMACs``
(per forward pass, FlopCounterMode FLOPs / 2), ``Latency (ms)`` (median over repeats ± between-repeat SD),
``TP (img/s)`` (throughput = batch / median latency) and ``PM (GiB)`` (CUDA: ``torch.cuda.max_memory_allocated``
peak; CPU: the peak RSS increase of one forward pass). A size at which a model ran out of memory, or was not
profiled, shows ``–``. Only batch-1 rows are used; with several precisions ``fp32`` is shown (else the first),
with several devices ``cuda``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, fmt_num
from msb.analysis.protocol.inputs import architecture_label
from msb.utils.hashing import sha256_json

__all__ = ["efficiency_table"]

_MIB_PER_GIB = 1024.0


def _one_of(df: pd.DataFrame, col: str, preferred: str) -> str:
    vals = sorted(set(df[col].astype(str)))
    return preferred if preferred in vals else vals[0]


def efficiency_table(profile: pd.DataFrame) -> PaperTable:
    """The paper-layout efficiency table of profile rows (module docstring).

    Args:
        profile: profile rows (``model, input_h, input_w, batch_size, precision, device, params_m, gmacs,
            latency_ms_median, latency_ms_sd, throughput_ips, peak_mem_mib, peak_mem_delta_mib, status`` and the
            protocol columns ``warmup, timed_passes, repeats, device_name``).

    Returns:
        :class:`PaperTable` ``efficiency`` (values: GMACs, ms, img/s, GiB as floats; NaN where not measured).

    Raises:
        AnalysisSkipped: no batch-1 row.
    """
    p = profile[profile["batch_size"] == 1] if "batch_size" in profile.columns else profile
    if p.empty:
        raise AnalysisSkipped("no batch-1 rows in the profile tables; run `msb profile --study STUDY` "
                              "(default batch size 1)")
    device = _one_of(p, "device", "cuda")
    p = p[p["device"].astype(str) == device]
    prec = _one_of(p, "precision", "fp32")
    p = p[p["precision"].astype(str) == prec]
    sizes = sorted({(int(h), int(w)) for h, w in zip(p["input_h"], p["input_w"])})
    mem_col = "peak_mem_mib" if device == "cuda" else "peak_mem_delta_mib"
    models = list(dict.fromkeys(p.sort_values("params_m", kind="stable")["model"].astype(str)))
    cols = [("", "Architecture"), ("", "Param (M)")]
    for h, w in sizes:
        cols += [(f"{h}×{w}", m) for m in ("GMACs", "Latency (ms)", "TP (img/s)", "PM (GiB)")]
    vals, disp = [], []
    for m in models:
        g = p[p["model"].astype(str) == m]
        params = float(g["params_m"].dropna().iloc[0]) if g["params_m"].notna().any() else float("nan")
        v, d = [m, params], [m, fmt_num(params, 2)]
        for h, w in sizes:
            r = g[(g["input_h"] == h) & (g["input_w"] == w)]
            ok = len(r) and str(r["status"].iloc[0]) == "ok" if "status" in r.columns else len(r)
            if not ok:
                v += [np.nan] * 4
                d += ["–"] * 4
                continue
            r = r.iloc[0]
            mem = float(r[mem_col]) / _MIB_PER_GIB
            v += [float(r["gmacs"]), float(r["latency_ms_median"]), float(r["throughput_ips"]), mem]
            lat = fmt_num(float(r["latency_ms_median"]), 2)
            if np.isfinite(float(r["latency_ms_sd"])):
                lat += f" ± {float(r['latency_ms_sd']):.2f}"
            d += [fmt_num(float(r["gmacs"]), 2), lat, fmt_num(float(r["throughput_ips"]), 1), fmt_num(mem, 2)]
        vals.append(v)
        disp.append(d)
    idx = pd.MultiIndex.from_tuples(cols)
    proto = p.iloc[0]
    what = ("maximum allocated CUDA memory" if device == "cuda" else "peak RSS increase of one forward pass (CPU)")
    cap = (f"Model-only inference efficiency at batch size 1 on {proto.get('device_name', device)} ({prec}): "
           f"GMACs per forward pass; latency median over {proto.get('repeats', '?')} repeats of "
           f"{proto.get('timed_passes', '?')} timed passes after {proto.get('warmup', '?')} warm-up passes "
           f"(± between-repeat SD); TP = 1 / median latency; PM = {what}; – = not measured or out of memory")
    return PaperTable("efficiency", pd.DataFrame(vals, columns=idx), pd.DataFrame(disp, columns=idx), cap)


def _profile_label(model: dict) -> str:
    """The label ``msb profile`` gives a run's model (:func:`msb.profiling.measure.model_label`, the same
    formula): ``arch`` or ``arch-encoder``, plus the first 6 hex of the SHA-256 of ``params`` when set."""
    label = str(model.get("arch")) if not model.get("encoder") else f"{model.get('arch')}-{model.get('encoder')}"
    if model.get("params"):
        label += "-" + sha256_json(model["params"])[:6]
    return label


def architecture_names(runs: dict) -> dict[str, str]:
    """Profile model label -> the study's architecture config name (from the run ids,
    :func:`~msb.analysis.protocol.inputs.architecture_label`), for labels that stand for one architecture only.

    Args:
        runs: run id -> :class:`~msb.analysis.report.contract.RunInfo` (its ``config`` dict)."""
    found: dict[str, set[str]] = {}
    for rid, info in runs.items():
        model = (info.config or {}).get("model") or {}
        if model.get("arch"):
            ds = str(((info.config or {}).get("data") or {}).get("name", ""))
            found.setdefault(_profile_label(model), set()).add(architecture_label(rid, ds))
    return {lab: next(iter(a)) for lab, a in found.items() if len(a) == 1}


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry: needs a profile table below the study folder. Profile labels that stand for one of the
    study's architectures are shown under that architecture's name (as in the other tables)."""
    if art.profile is None or art.profile.empty:
        raise AnalysisSkipped(f"no profile table (profile*.parquet) below {art.study_dir}; run "
                              f"`msb profile --study {art.study_dir}`")
    names = architecture_names(art.runs)
    prof = art.profile.assign(model=[names.get(str(m), str(m)) for m in art.profile["model"]])
    prof, note = _one_class_count(prof, options.get("efficiency_num_classes"))
    t = efficiency_table(prof)
    notes = [f"{lab} profiled as {arch}" for lab, arch in sorted(names.items()) if lab in set(art.profile["model"])]
    return AnalysisOutput(tables=[t], notes=notes + ([note] if note else []))


def _one_class_count(prof: pd.DataFrame, wanted: int | None) -> tuple[pd.DataFrame, str]:
    """Profile rows of one output-class count per model: ``wanted`` (``analyses.efficiency_num_classes``) where
    a model was profiled with it, else the model's first profiled count. Returns the rows and a note naming
    the counts shown when a model had several (else "")."""
    if "num_classes" not in prof.columns or prof.groupby("model")["num_classes"].nunique().max() <= 1:
        return prof, ""
    keep = []
    for _, g in prof.groupby("model", sort=False):
        counts = list(dict.fromkeys(g["num_classes"].astype(int)))
        pick = int(wanted) if wanted is not None and int(wanted) in counts else counts[0]
        keep.append(g[g["num_classes"].astype(int) == pick])
    out = pd.concat(keep).sort_index()
    shown = sorted(set(out["num_classes"].astype(int)))
    return out, (f"models profiled at several output-class counts ({sorted(set(prof['num_classes'].astype(int)))}); "
                 f"the table shows {shown} (analyses.efficiency_num_classes: {wanted})")
