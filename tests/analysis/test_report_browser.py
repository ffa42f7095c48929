"""The study report in a real browser: headless Debian Chromium (`apt-get install chromium chromium-driver`),
driven by Selenium pointed at that executable (no browser download).

The study (no training, ~1 s): two systems whose per-image counts are written by hand (14 images, one class),
each with a 4-epoch train_log.csv, so the page holds the summary, the checklist, the detail sections, figures
(score distributions, paired differences, ranking changes, training curves) and a 20-column CSV-linked table.
Checks: no console errors; every <img> decoded (naturalWidth > 0); nothing wider than the 1280 px viewport,
closed and with every <details> opened; the leaderboard and the checklist inside the first viewport. A
screenshot of the first viewport is written to tmp and its path printed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.analysis.report.report import build_report

_CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
_DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    _CHROMIUM is None or _DRIVER is None,
    reason="Chromium not installed: `apt-get install -y chromium chromium-driver` (Debian; .ci/run does it)")

VIEWPORT = (1280, 800)

# elements whose right edge passes the viewport, ignoring those inside a box that scrolls or clips itself
_TOO_WIDE_JS = """
const w = document.documentElement.clientWidth;
const clipped = e => { for (let a = e.parentElement; a; a = a.parentElement) {
  const o = getComputedStyle(a).overflowX; if (o === 'auto' || o === 'scroll' || o === 'hidden') return true; }
  return false; };
const bad = [];
for (const e of document.querySelectorAll('body *')) {
  const r = e.getBoundingClientRect();
  if (r.width > 0 && (r.right > w + 0.5 || r.left < -0.5) && !clipped(e)) bad.push(e.tagName + '#' + e.id + '.' + e.className);
}
return [w, document.documentElement.scrollWidth, bad];
"""


def _study(root: Path) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import _two_system_study

    rng = np.random.default_rng(3)
    ref = rng.integers(30, 300, 14)
    tp_a = np.floor(ref * rng.uniform(0.6, 0.95, 14)).astype(np.int64)
    tp_b = np.floor(ref * rng.uniform(0.3, 0.9, 14)).astype(np.int64)
    fp_a, fp_b = rng.integers(0, 60, 14), rng.integers(0, 60, 14)
    study = _two_system_study(root, np.stack([tp_a, fp_a, ref - tp_a], 1), np.stack([tp_b, fp_b, ref - tp_b], 1))
    for k, rd in enumerate(sorted(p for p in study.iterdir() if p.is_dir())):
        pd.DataFrame({"epoch": [1, 2, 3, 4], "train_loss": [1.2, 0.8, 0.6, 0.5 + 0.1 * k],
                      "val_loss": [1.4, 1.0, 0.9, 0.85], "val_dice": [0.3, 0.5, 0.6, 0.65 - 0.1 * k]}
                     ).to_csv(rd / "train_log.csv", index=False)
    return study


def test_report_renders_in_headless_chromium(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    res = build_report(_study(tmp_path), tmp_path / "rep", n_boot=200)
    opts = Options()
    opts.binary_location = _CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}", "--hide-scrollbars"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(executable_path=_DRIVER), options=opts)
    except Exception as e:  # selenium's WebDriverException: the browser cannot start here
        pytest.skip(f"Chromium at {_CHROMIUM} does not start under chromedriver {_DRIVER}: {str(e)[:200]}")
    try:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {  # the viewport itself, not the window
            "width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})
        driver.get(res.html.as_uri())
        width, height = driver.execute_script("return [window.innerWidth, window.innerHeight]")
        assert (width, height) == VIEWPORT
        shot = tmp_path / "report-first-viewport.png"
        driver.save_screenshot(str(shot))
        print(f"screenshot of the first viewport ({width} x {height} px): {shot}")

        # the leaderboard and the checklist lie inside the first viewport
        for sel in ("#leaderboard table", "#checklist-table"):
            top, bottom = driver.execute_script(
                f"const r = document.querySelector('{sel}').getBoundingClientRect(); return [r.top, r.bottom]")
            assert 0 <= top and bottom <= height, (sel, top, bottom, height)
        cw, sw, bad = driver.execute_script(_TOO_WIDE_JS)
        assert bad == [] and sw <= cw, (cw, sw, bad)

        # open every collapsed section: images decoded, still nothing wider than the viewport
        n_details = driver.execute_script(
            "const d = document.querySelectorAll('details'); d.forEach(x => x.open = true); return d.length")
        assert n_details >= 8
        imgs = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt.slice(0, 40), i.complete, i.naturalWidth])")
        assert len(imgs) >= 4 and all(c and w > 0 for _, c, w in imgs), imgs
        cw, sw, bad = driver.execute_script(_TOO_WIDE_JS)
        assert bad == [] and sw <= cw, (cw, sw, bad)
        # a wide table scrolls inside its own box
        boxes = driver.execute_script(
            "return Array.from(document.querySelectorAll('.table-wrap')).map(b => [b.scrollWidth, b.clientWidth])")
        assert boxes and all(cwb <= cw for _, cwb in boxes)

        errors = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert errors == [], errors
    finally:
        driver.quit()
