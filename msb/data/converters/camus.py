"""CAMUS converter: 2D echocardiography, two views x two phases per patient -> a four-class prepared dataset.

Citation: Leclerc S., Smistad E., Pedrosa J., Østvik A., Cervenansky F., Espinosa F., Espeland T., Berg E.A.R.,
Jodoin P.-M., Grenier T., Lartizien C., D'hooge J., Lovstakken L., Bernard O. "Deep Learning for Segmentation
Using an Open Large-Scale Dataset in 2D Echocardiography." IEEE Transactions on Medical Imaging 38(9):2198-2210,
2019. doi:10.1109/TMI.2019.2900516.
Download: https://www.creatis.insa-lyon.fr/Challenge/camus/ (the public release of 500 patients on the
Human Heart Project database linked there; registration required). Licence: as stated on the download page
(research use, cite the article); not verified here, check before redistribution (docs/datasets.md).

Source layouts (both searched up to three folder levels below ``source``):

* the public NIfTI release (``CAMUS_public/database_nifti/patientNNNN/``): ``patientNNNN_{2CH,4CH}_{ED,ES}.nii.gz``
  images, ``..._gt.nii.gz`` masks (also ``.nii``), ``Info_2CH.cfg`` / ``Info_4CH.cfg``, and half sequences
  (``..._half_sequence.nii.gz``, ignored);
* the older challenge release (``training/patientNNNN/``): the same names as MetaImage ``.mhd`` headers with
  ``.raw`` data. Testing patients without ``_gt`` files are skipped and counted in the notes.

Reading: SimpleITK for both formats; the array is ``(rows, cols)`` = ``GetArrayFromImage`` (a singleton third
axis is dropped). Spacing ``GetSpacing() = (x, y)`` mm/px becomes ``spacing_col = x``, ``spacing_row = y``.
Images are written as 8-bit grey PNG: unchanged when the source is 8-bit (as CAMUS is), otherwise min-max scaled
to 0-255 (counted in the notes). Masks keep their label values, which must lie in {0, 1, 2, 3}:

===== ===================== =====================================
value class                 structure (CAMUS annotation)
===== ===================== =====================================
0     ``background``        everything else
1     ``lv_cavity``         left-ventricle cavity (LV endocardium)
2     ``myocardium``        LV myocardium (endocardium-epicardium)
3     ``left_atrium``       left atrium
===== ===================== =====================================

One sample per patient x view x phase: ``sample_id`` = ``patientNNNN_2CH_ED``, ``group`` = ``patientNNNN`` (so
group-aware splits and folds keep a patient's four images together), ``source`` = ``camus``, ``split`` empty,
extra columns ``view``, ``phase``, ``image_quality``, ``sex``, ``age``, ``lv_ef`` from ``Info_<view>.cfg``
(``key: value`` lines; empty when a key or the file is absent). The MSB paper keeps 1,996 of the 2,000 images
after duplicate removal: run ``msb audit`` on the prepared dataset.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
import pandas as pd

from msb.data.converters._common import check_limit, listed
from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import INDEX_COLUMNS, ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes

__all__ = ["convert_camus", "read_camus_image", "read_info_cfg", "CLASSES", "VIEWS", "PHASES"]

SOURCE_LABEL = "camus"
CLASSES = [ClassSpec(0, "background", (0,)), ClassSpec(1, "lv_cavity", (1,)), ClassSpec(2, "myocardium", (2,)),
           ClassSpec(3, "left_atrium", (3,))]
VIEWS: tuple[str, ...] = ("2CH", "4CH")
PHASES: tuple[str, ...] = ("ED", "ES")
_EXTS: tuple[str, ...] = (".nii.gz", ".nii", ".mhd")
_PATIENT = re.compile(r"^patient\d+$", re.IGNORECASE)
#: Info_<view>.cfg key -> index column
_INFO_KEYS = {"ImageQuality": "image_quality", "Sex": "sex", "Age": "age", "EF": "lv_ef", "LVef": "lv_ef"}
_EXTRA = ("view", "phase", "image_quality", "sex", "age", "lv_ef")


def read_camus_image(path: Path) -> tuple[np.ndarray, tuple[float, float]]:
    """Read one 2D CAMUS image or mask (NIfTI or MetaImage) with SimpleITK.

    Returns:
        ``(array (rows, cols) in the file's dtype, (spacing_row, spacing_col) in mm/px)``.

    Raises:
        MSBError: unreadable file, or an image that is not 2D (a third axis longer than 1).
    """
    import SimpleITK as sitk

    try:
        img = sitk.ReadImage(str(path))
    except RuntimeError as exc:
        raise MSBError(f"{path}: cannot be read as NIfTI/MetaImage ({str(exc).strip().splitlines()[-1]}); "
                       f"re-download the file (for .mhd the .raw file must lie beside it)") from None
    arr = sitk.GetArrayFromImage(img)
    spacing = img.GetSpacing()
    if arr.ndim == 3 and arr.shape[0] == 1:  # a 2D frame stored with a third axis of length 1
        arr = arr[0]
    if arr.ndim != 2:
        raise MSBError(f"{path}: expected a 2D image, got shape {arr.shape}; the ED/ES files are single frames "
                       f"(half sequences are not converted)")
    return arr, (float(spacing[1]), float(spacing[0]))


def read_info_cfg(path: Path) -> dict[str, str]:
    """``key: value`` lines of a CAMUS ``Info_<view>.cfg`` -> dict (empty when the file is absent).

    Raises:
        MSBError: a non-empty line without ``:`` (naming the file and line).
    """
    if not path.is_file():
        return {}
    out = {}
    for k, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise MSBError(f"{path}: line {k} {line!r} is not 'key: value'; is this a CAMUS Info_*.cfg file?")
        out[key.strip()] = value.strip()
    return out


def _find_patients(source: Path) -> list[Path]:
    """Folders named ``patientNNNN`` at most three levels below ``source`` (``source`` itself included)."""
    found, level = [], [source]
    for _ in range(4):
        nxt = []
        for d in level:
            if _PATIENT.match(d.name):
                found.append(d)
            else:
                nxt += [c for c in sorted(d.iterdir()) if c.is_dir() and not c.name.startswith(".")]
        level = nxt
    return sorted(found, key=lambda p: (p.name.lower(), str(p)))


def _file(folder: Path, stem: str) -> Path | None:
    for ext in _EXTS:
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return None


def _to_uint8(arr: np.ndarray) -> tuple[np.ndarray, bool]:
    """Grey image -> uint8 (unchanged when uint8, else min-max scaled); ``(image, scaled)``."""
    if arr.dtype == np.uint8:
        return arr, False
    a = arr.astype(np.float64)
    lo, hi = float(a.min()), float(a.max())
    scaled = np.zeros(a.shape) if hi <= lo else (a - lo) / (hi - lo) * 255.0
    return np.clip(np.rint(scaled), 0, 255).astype(np.uint8), True


def _png(arr: np.ndarray, path: Path) -> bytes:
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(arr), [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:  # pragma: no cover
        raise MSBError(f"{path}: could not encode as PNG.")
    return buf.tobytes()


def convert_camus(source: str | os.PathLike, out: str | os.PathLike, *, views: Sequence[str] = VIEWS,
                  phases: Sequence[str] = PHASES, limit: int | None = None, overwrite: bool = False
                  ) -> ConversionReport:
    """Convert a CAMUS release (module docstring) into a prepared dataset at ``out``.

    Args:
        source: folder holding the ``patientNNNN/`` folders (or a parent up to three levels above them).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        views: subset of ``2CH``, ``4CH``; phases: subset of ``ED``, ``ES``.
        limit: convert the first ``limit`` patients (by name) only.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (``n_changed_mask_pixels`` = 0: labels are kept).

    Raises:
        MSBError: no patient folder, a label value outside 0-3, image/mask size mismatch, unreadable files,
            bad options, no sample with a mask. Nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the CAMUS folder holding the patientNNNN/ folders "
                       f"(e.g. CAMUS_public/database_nifti or training/).")
    check_limit(limit)
    views = [str(v).upper() for v in views]
    phases = [str(p).upper() for p in phases]
    for what, got, valid in (("views", views, VIEWS), ("phases", phases, PHASES)):
        bad = [g for g in got if g not in valid]
        if bad or not got:
            raise MSBError(f"{what} must be a non-empty subset of {list(valid)}, got {list(got)}.")
    patients = _find_patients(source)
    if not patients:
        raise MSBError(f"{source}: no patientNNNN/ folder found (searched three levels deep); --source must be the "
                       f"unzipped CAMUS release (database_nifti/ or training/).")
    names = [p.name for p in patients]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MSBError(f"{source}: patient folder(s) {listed(dup)} found twice; pass the one release folder")
    notes = [f"{len(patients)} patient folder(s) under {source}"]
    if limit is not None and limit < len(patients):
        notes.append(f"limit={limit}: kept the first {limit} of {len(patients)} patients")
        patients = patients[:limit]
    rows, no_gt, formats, scaled, n_pixels = [], [], set(), 0, 0
    label_px = np.zeros(len(CLASSES), np.int64)
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        for folder in patients:
            pid = folder.name
            for view in views:
                info = read_info_cfg(folder / f"Info_{view}.cfg")
                extra = {c: "" for c in _EXTRA}
                extra.update({col: info[k] for k, col in _INFO_KEYS.items() if k in info})
                for phase in phases:
                    stem = f"{pid}_{view}_{phase}"
                    img_p, gt_p = _file(folder, stem), _file(folder, f"{stem}_gt")
                    if gt_p is None:
                        no_gt.append(stem)
                        continue
                    if img_p is None:
                        raise MSBError(f"{gt_p}: mask without its image {stem}.nii.gz/.mhd in {folder}; "
                                       f"re-download this patient")
                    formats.add(".mhd" if img_p.suffix == ".mhd" else "NIfTI")
                    img, spacing = read_camus_image(img_p)
                    gt, _ = read_camus_image(gt_p)
                    if img.shape != gt.shape:
                        raise MSBError(f"image {img_p} is {img.shape[0]}x{img.shape[1]} (HxW) but its mask {gt_p} "
                                       f"is {gt.shape[0]}x{gt.shape[1]}; they must have the same size")
                    vals = np.unique(gt)
                    if not np.isin(vals, [0, 1, 2, 3]).all():
                        raise MSBError(f"{gt_p}: label values {[v.item() for v in vals if v not in (0, 1, 2, 3)]} "
                                       f"outside 0-3 (background, LV cavity, myocardium, left atrium)")
                    img8, was_scaled = _to_uint8(img)
                    scaled += int(was_scaled)
                    mask = gt.astype(np.uint8)
                    label_px += np.bincount(mask.ravel(), minlength=4)[:4]
                    n_pixels += mask.size
                    atomic_write_bytes(tmp / "images" / f"{stem}.png", _png(img8, img_p))
                    atomic_write_bytes(tmp / "masks" / f"{stem}.png", _png(mask, gt_p))
                    rows.append({"sample_id": stem, "image_path": f"images/{stem}.png",
                                 "mask_path": f"masks/{stem}.png", "split": "", "group": pid,
                                 "height": int(mask.shape[0]), "width": int(mask.shape[1]), "source": SOURCE_LABEL,
                                 "spacing_row": spacing[0], "spacing_col": spacing[1],
                                 **extra, "view": view, "phase": phase})
        if not rows:
            raise MSBError(f"{source}: no image with a _gt mask among {len(patients)} patient(s) (views {views}, "
                           f"phases {phases}); the testing release has no public masks")
        index = pd.DataFrame(rows, columns=[*INDEX_COLUMNS, "spacing_row", "spacing_col", *_EXTRA])
        write_prepared_dataset(tmp, index, CLASSES)
        load_prepared_dataset(tmp, check_files=True)
    notes.append(f"format: {', '.join(sorted(formats))}; {len(rows)} image(s) = patient x view x phase, "
                 f"group = patient ({index['group'].nunique()} patients)")
    if no_gt:
        notes.append(f"skipped {len(no_gt)} view/phase image(s) without a _gt mask: {listed(no_gt)}")
    if scaled:
        notes.append(f"{scaled} image(s) were not 8-bit and were min-max scaled to 0-255")
    notes.append("mask pixels per class: " + ", ".join(f"{c.name} {int(n):,}" for c, n in zip(CLASSES, label_px)))
    notes.append("the MSB paper keeps 1,996 of 2,000 images after duplicate removal: run `msb audit` on the result")
    return ConversionReport(n_samples=len(rows), n_changed_mask_pixels=0, notes=notes,
                            out=Path(out).expanduser().absolute(), name="camus", n_mask_pixels=n_pixels)
