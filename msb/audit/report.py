"""Audit reports: CSV tables, one XLSX workbook (openpyxl) and an HTML contact sheet for manual review.

Files written into the audit folder (each atomically; an existing file is replaced):

==========================  ==================================================================================
file                        content
==========================  ==================================================================================
``census.csv``              the cross-boundary census (:mod:`msb.audit.census`), one row per quantity
``pairs.csv``               every candidate pair with its distances, screens, ``confirmed``, ``crosses``,
                            ``hash_candidate`` (found by the pHash/dHash prefilter)
``counterparts.csv``        counterpart rules ``first`` / ``any`` (:mod:`msb.audit.counterparts`): counts with
                            unit and denominator per rule and relation
``clusters.csv``            groups with >= 2 rows of every relation (``keys`` ``;``-joined)
``images.csv``              one row per image: hashes, sizes, cluster label per relation
``audit.xlsx``              sheets ``census``, ``counterparts``, ``pairs``, ``clusters``, ``images``, ``parameters``
``contact_sheet.html``      candidate pairs side by side (crossing first, then by distance) with their numbers
``audit.json``              parameters (rules, thresholds, screen resolution and interpolation, versions, times)
``verdict.json``            the verdict (:mod:`msb.audit.verdict`): status, requested and failed checks, every
                            check's crossing groups/rows with denominators, the one-line summary
``predicates.csv``          the default and the strict predicate side by side, counts with denominators
                            (:mod:`msb.audit.calibration`)
``calibration.csv``         single-dataset mode: per screen and threshold, cross-group and within-group pairs
``group_links.csv``         single-dataset mode: confirmed pairs of two different groups (NCC, SSIM, distances)
``fov_mask.png``            the dataset content mask (255 = content) when the frame is left out
                            (:mod:`msb.audit.content`)
``decisions_template.csv``  single-dataset mode: one ``group`` decision per near-duplicate cluster member, ready
                            for ``msb audit --apply`` (edit ``action`` to ``drop``/``keep`` as reviewed)
==========================  ==================================================================================
"""

from __future__ import annotations

import base64
import functools
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
from jinja2 import Environment
from PIL import Image

from msb.audit.calibration import calibration_table, group_links, predicates_table, spanning_clusters
from msb.audit.content import FovMask, write_fov_mask
from msb.audit.core import AuditResult
from msb.audit.counterparts import rule_summary
from msb.utils.atomic import atomic_path, atomic_write_text

_SHEET = Environment(autoescape=True).from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>msb audit: {{ title }}</title>
<style>
body{font-family:sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:3px 7px;font-size:13px;text-align:left}
.pair{display:inline-block;border:1px solid #bbb;margin:6px;padding:6px;vertical-align:top;width:{{ 2*px+24 }}px}
.pair.cross{border:2px solid #c0392b}
.pair img{max-width:{{ px }}px;max-height:{{ px }}px;margin:2px}
.meta{font-size:12px}
.no{color:#888}
.verdict{font-size:16px;padding:6px 10px;border:2px solid #27ae60}
.verdict.fail{border-color:#c0392b;color:#c0392b}
</style></head><body>
<h1>Duplicate and leakage audit: {{ title }}</h1>
<p class="verdict {{ verdict.status|lower }}"><b>{{ verdict.line }}</b></p>
<h2>Summary</h2>
<table><tr><th>check</th><th>crossing groups</th><th>of groups (&ge; 2 rows)</th><th>crossing rows</th>
<th>of rows with a side</th><th>side pairs crossed</th><th>gated</th></tr>
{% for c in verdict.checks %}{% if c.available %}<tr><td>{{ c.check }} ({{ c.relation }})</td><td>{{ c.crossing_groups }}</td>
<td>{{ c.groups }}</td><td>{{ c.crossing_rows }}</td><td>{{ c.rows_with_side }}</td>
<td>{% for k, v in c.side_pairs.items() %}{{ k }}: {{ v }}{% if not loop.last %}, {% endif %}{% endfor %}</td>
<td>{% if c.check in verdict.failed %}<b>FAIL</b>{% elif c.check in verdict.checked %}pass{% else %}not gated{% endif %}</td></tr>
{% endif %}{% endfor %}</table>
{% if spanning %}<h2>Clusters that join several groups ({{ spanning|length }})</h2>
<p>Confirmed near-duplicate clusters holding rows of two or more groups, joined by the linking pairs below (an upper
bound on false positives: frames of different recordings are presumed independent). <code>--apply-clusters</code>
does not follow these links unless the decisions file puts both samples into one group.</p>
<table><tr><th>cluster</th><th>rows</th><th>groups</th><th>sides</th><th>linking pair(s)</th></tr>
{% for c in spanning %}<tr><td>{{ c.cluster }}</td><td>{{ c.n_rows }}</td><td>{{ c.groups }}</td><td>{{ c.sides }}</td>
<td>{{ c.linking_pairs }}</td></tr>{% endfor %}</table>{% endif %}
{% if fov %}<h2>Screens on the content</h2>
<p>Content mask: <b>{{ fov.mode }}</b> ({{ fov.rule }}); left out: <b>{{ "%.1f"|format(100 * fov.left_out_fraction) }} %</b>
of the thumbnail pixels{% for n in fov.notes %}; {{ n }}{% endfor %}.{% if fov_png %}
<img src="{{ fov_png }}" alt="content mask" style="width:96px;height:96px;border:1px solid #999;vertical-align:middle">
(white = content; fov_mask.png){% endif %}</p>{% endif %}
{% if predicates %}<h2>Predicates</h2>
<table><tr>{% for k in predicates[0].keys() %}<th>{{ k }}</th>{% endfor %}</tr>
{% for r in predicates %}<tr>{% for v in r.values() %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</table>{% endif %}
{% if calibration %}<h2>Calibration on known groups</h2>
<p>Default predicate: {{ verdict.predicate.cross_group_pairs }} confirmed pairs across groups of {{ verdict.predicate.cross_group_denominator }},
{{ verdict.predicate.within_group_pairs }} within groups of {{ verdict.predicate.within_group_denominator }}. Per screen alone, the
range that confirms no cross-group pair and the within-group candidate pairs it keeps (all thresholds: calibration.csv):</p>
<table><tr><th>screen</th><th>no cross-group pair at</th><th>within-group pairs kept</th><th>of within-group candidates</th></tr>
{% for c in calibration %}<tr><td>{{ c.screen }}</td><td>{{ c.no_cross_group }}</td><td>{{ c.within_kept }}</td><td>{{ c.within_candidates }}</td></tr>{% endfor %}</table>{% endif %}
{% if counterparts %}<h2>Counterparts of evaluation rows</h2>
<p>{{ params.counterparts.rule_text }}</p>
<table><tr>{% for k in counterparts[0].keys() %}<th>{{ k }}</th>{% endfor %}</tr>
{% for r in counterparts %}<tr>{% for v in r.values() %}<td>{{ v }}</td>{% endfor %}</tr>{% endfor %}</table>{% endif %}
<p>Boundary: <b>{{ params.boundary }}</b>. Rows: {{ params.n_rows }} ({{ params.n_unassigned_rows }} without a side).
Candidate rule: {{ params.candidate_rule }}. Confirmation: {{ params.confirmation_rule }}.
{% if params.screens %}Screens: {{ params.screens }}.{% endif %}
{% if recall %}Hash prefilter recall: {{ recall }}.{% endif %}</p>
<h2>Census (every relation, quantity and side)</h2>
<table><tr><th>relation</th><th>quantity</th><th>scope</th><th>count</th><th>unit</th><th>of</th><th>denominator unit</th></tr>
{% for r in census %}<tr><td>{{ r.relation }}</td><td>{{ r.quantity }}</td><td>{{ r.scope }}</td><td>{{ r.count }}</td>
<td>{{ r.unit }}</td><td>{{ r.denominator }}</td><td>{{ r.denominator_unit }}</td></tr>
{% endfor %}</table>
<h2>Candidate pairs ({{ shown }} of {{ total }} shown{% if total > shown %}; the rest are in pairs.csv{% endif %})</h2>
<p>Red frame: the pair crosses the boundary. Pairs linking two groups come first (marked). Distances are Hamming
distances of 64-bit hashes.</p>
{% for p in pairs %}<div class="pair{% if p.crosses %} cross{% endif %}">
<img src="{{ p.img_a }}" alt="{{ p.key_a }}"><img src="{{ p.img_b }}" alt="{{ p.key_b }}">
<div class="meta"><b>{{ p.key_a }}</b> ({{ p.side_a or "no side" }}) &harr; <b>{{ p.key_b }}</b> ({{ p.side_b or "no side" }})<br>
pHash d={{ p.phash_distance }}, dHash d={{ p.dhash_distance }}{% if p.same_bytes %}, <b>identical bytes</b>{% endif %}<br>
NCC={{ p.ncc }}, SSIM={{ p.ssim }}, {% if p.confirmed %}confirmed{% else %}<span class="no">not confirmed</span>{% endif %},
cluster {{ p.near_duplicate_cluster }}{% if p.cross_group %}, <b>links groups {{ p.group_a }} and {{ p.group_b }}</b>{% endif %}</div></div>
{% endfor %}
</body></html>
""")


@functools.lru_cache(maxsize=4096)
def _thumb_data_uri(path: str, px: int) -> str:
    """PNG data URI of a ``px``-pixel thumbnail (JPEGs decoded at a reduced scale with PIL's ``draft``; a row in
    several pairs is decoded once)."""
    try:
        with Image.open(path) as im:
            im.draft("RGB", (px, px))  # JPEG: DCT scaling to >= px (1/2 .. 1/8); other formats: no-op
            im = im.convert("RGB")
            im.thumbnail((px, px), Image.Resampling.BILINEAR)
            buf = io.BytesIO()
            im.save(buf, format="PNG", optimize=False)
    except (OSError, ValueError):
        return ""
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.3f}"


def render_contact_sheet(result: AuditResult, max_pairs: int = 300, px: int = 160) -> str:
    """HTML text of the contact sheet (thumbnails embedded as PNG data URIs, ``px`` pixels on the long side).

    Pairs are ordered crossing first, then confirmed, then by pHash and dHash distance; at most ``max_pairs``.
    """
    p = result.pairs.assign(link_=result.pairs["confirmed"] & result.pairs.get("cross_group", False))
    p = p.sort_values(["link_", "crosses", "confirmed", "phash_distance", "dhash_distance", "a", "b"],
                      ascending=[False, False, False, True, True, True, True]).head(max_pairs)
    paths = result.rows["image_path"].to_numpy()
    groups = result.rows["group"].to_numpy().astype(str)
    items = []
    for r in p.itertuples(index=False):
        items.append({"key_a": r.key_a, "key_b": r.key_b, "side_a": r.side_a, "side_b": r.side_b,
                      "phash_distance": int(r.phash_distance), "dhash_distance": int(r.dhash_distance),
                      "same_bytes": bool(r.same_bytes), "ncc": _fmt(r.ncc), "ssim": _fmt(r.ssim),
                      "confirmed": bool(r.confirmed), "crosses": bool(r.crosses),
                      "near_duplicate_cluster": int(r.near_duplicate_cluster),
                      "cross_group": bool(r.link_), "group_a": groups[r.a], "group_b": groups[r.b],
                      "img_a": _thumb_data_uri(paths[r.a], px), "img_b": _thumb_data_uri(paths[r.b], px)})
    title = " vs ".join(result.datasets)
    cp = getattr(result, "counterparts", None)
    verdict = result_verdict(result)
    fov = result.params.get("fov")
    return _SHEET.render(title=title, params=result.params, census=result.census.to_dict("records"), pairs=items,
                         fov=fov if fov and fov.get("mode") != "none" else None, fov_png=_mask_uri(result),
                         spanning=spanning_clusters(result.rows, result.pairs).to_dict("records")
                         if result.boundary == "split" else [],
                         predicates=pd.DataFrame(verdict.get("predicates", [])).to_dict("records"),
                         calibration=verdict.get("predicate", {}).get("calibration", []),
                         shown=len(items), total=len(result.pairs), px=px, verdict=verdict,
                         counterparts=rule_summary(cp).to_dict("records") if cp is not None and len(cp) else [],
                         recall=recall_text(result.params))


def _mask_uri(result: AuditResult) -> str:
    m = getattr(result, "fov_mask", None)
    if m is None:
        return ""
    buf = io.BytesIO()
    Image.fromarray(m.astype(np.uint8) * 255).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def recall_text(params: dict) -> str:
    """``"k = 8: 81 of 129 (62.8 %), k = 12: ..."`` from ``params["prefilter_recall"]`` (``""`` when absent)."""
    rec = params.get("prefilter_recall")
    if not rec or not rec.get("n_reference_pairs"):
        return ""
    parts = [f"k = {k}: {v['found']} of {rec['n_reference_pairs']} ({100 * v['recall']:.1f} %)"
             for k, v in rec["by_k"].items()]
    return ", ".join(parts) + f" (reference: {rec['reference']})"


def result_verdict(result: AuditResult) -> dict:
    """``result.verdict``, or the verdict with no check requested when the audit was run without one."""
    from msb.audit.calibration import judged

    return result.verdict if result.verdict is not None else judged(result)


def all_clusters(result: AuditResult) -> pd.DataFrame:
    """Groups with >= 2 rows of every relation (see :meth:`AuditResult.clusters`)."""
    rels = [c[len("cluster_"):] for c in result.rows.columns if c.startswith("cluster_")]
    frames = [result.clusters(r) for r in rels]
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else result.clusters(rels[0])


def write_audit(result: AuditResult, out_dir: str | Path, max_sheet_pairs: int = 300, thumb_px: int = 160
                ) -> list[Path]:
    """Write the report files listed in the module docstring into ``out_dir``.

    Args:
        result: from :func:`msb.audit.core.run_audit`.
        out_dir: audit folder (created if needed).
        max_sheet_pairs: pairs shown on the contact sheet (all are in ``pairs.csv``).
        thumb_px: contact-sheet thumbnail size (long side, pixels).

    Returns:
        The written paths.
    """
    from msb.audit.curate import cluster_decisions

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clusters = all_clusters(result)
    params = pd.DataFrame([{"parameter": k, "value": json.dumps(v) if isinstance(v, (dict, list)) else v}
                           for k, v in result.params.items()])
    written = []
    tables = {"census.csv": result.census, "pairs.csv": result.pairs, "clusters.csv": clusters,
              "images.csv": result.rows}
    if result.counterparts is not None:
        tables["counterparts.csv"] = result.counterparts
    tables["predicates.csv"] = predicates_table(result.rows, result.pairs, result.params["confirmation_rule"])
    if result.boundary == "split":
        cfg = result.params["config"]
        tables["calibration.csv"] = calibration_table(result.rows, result.pairs, int(cfg["hamming_k"]), cfg["ncc_min"])
        tables["group_links.csv"] = group_links(result.rows, result.pairs)
    for name, df in tables.items():
        atomic_write_text(out / name, df.to_csv(index=False, lineterminator="\n"))
        written.append(out / name)
    if getattr(result, "fov_mask", None) is not None:
        written.append(write_fov_mask(FovMask("auto", result.fov_mask), out / "fov_mask.png"))
    with atomic_path(out / "audit.xlsx") as tmp:
        with pd.ExcelWriter(tmp, engine="openpyxl") as xw:
            sheets = [("census", result.census), ("pairs", result.pairs), ("clusters", clusters),
                      ("images", result.rows), ("parameters", params)]
            if result.counterparts is not None:
                sheets.insert(1, ("counterparts", result.counterparts))
            for sheet, df in sheets:
                df.to_excel(xw, sheet_name=sheet, index=False)
    written.append(out / "audit.xlsx")
    atomic_write_text(out / "contact_sheet.html", render_contact_sheet(result, max_sheet_pairs, thumb_px))
    written.append(out / "contact_sheet.html")
    atomic_write_text(out / "audit.json", json.dumps(result.params, indent=2, sort_keys=True, default=str) + "\n")
    written.append(out / "audit.json")
    atomic_write_text(out / "verdict.json", json.dumps(result_verdict(result), indent=2, ensure_ascii=False) + "\n")
    written.append(out / "verdict.json")
    if result.boundary == "split":
        atomic_write_text(out / "decisions_template.csv",
                          cluster_decisions(result).to_csv(index=False, lineterminator="\n"))
        written.append(out / "decisions_template.csv")
    return written


__all__ = ["write_audit", "render_contact_sheet", "all_clusters", "result_verdict", "recall_text"]
