"""A tiny synthetic stand-in for the PraNet polyp collection: the CI inputs of the polyp audit's P1-P3 studies.

:func:`write_synthetic_pranet` writes a raw folder in the PraNet layout (``TrainDataset/image|mask`` with
Kvasir-like ``cju*`` and CVC-ClinicDB-like numeric names, ``TestDataset/<set>/images|masks`` for the five test
sets of :data:`msb.data.converters.pranet.TEST_SETS`), frames drawn by the synthetic generator
(:mod:`msb.data.synth`) with a per-source appearance shift (background colour, polyp tint, blob size), so that a
model trained on the "seen" sources meets a mild domain shift on the "unseen" ones, as in the PraNet protocol.

The converter ``synthetic-pranet`` (:func:`convert_synthetic_pranet`, ``source`` ignored) writes that raw folder
into a temporary folder and converts it with the real PraNet-layout converter
(:func:`msb.data.converters.pranet.convert_pranet`), passing ``test_sets`` / ``train`` / ``val_fraction`` through,
so the CI studies exercise the same conversion path (sample ids, ``source``, mask threshold) as the real data.
Deterministic: the same arguments give byte-identical files (one ``default_rng(seed)`` per source).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from msb.data.converters.staging import ConversionReport
from msb.data.synth import _png, _render, _video_params
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes

__all__ = ["SOURCE_SHIFT", "write_synthetic_pranet", "convert_synthetic_pranet"]

#: source -> (background RGB offset, polyp tint factor, blob radius factor); Kvasir is the reference look.
SOURCE_SHIFT: dict[str, tuple[tuple[float, float, float], float, float]] = {
    "Kvasir": ((0.0, 0.0, 0.0), 1.0, 1.0),
    "CVC-ClinicDB": ((-0.06, -0.04, -0.02), 0.95, 0.9),
    "CVC-ColonDB": ((-0.10, 0.02, 0.06), 1.0, 0.8),
    "ETIS-LaribPolypDB": ((0.04, 0.06, 0.08), 1.05, 0.6),
    "CVC-300": ((-0.08, -0.02, 0.04), 0.97, 0.85),
}
_TRAIN_SOURCES = ("Kvasir", "CVC-ClinicDB")


def _frames(source: str, n: int, size: tuple[int, int], seed: int, empty_fraction: float):
    off, tint, rscale = SOURCE_SHIFT[source]
    rng = np.random.default_rng([seed, list(SOURCE_SHIFT).index(source)])
    n_videos = max(1, min(n, 4))
    videos = []
    for _ in range(n_videos):
        v = _video_params(rng)
        v["base"] = np.clip(v["base"] + np.asarray(off, np.float32), 0.05, 1.0)
        v["tint"] = v["tint"] * np.float32(tint)
        for b in v["blobs"]:
            b["r"] = max(0.08, b["r"] * rscale)
        videos.append(v)
    empty = rng.random(n) < empty_fraction
    for i in range(n):
        yield _render(rng, size, videos[i * n_videos // n], bool(empty[i]))


def write_synthetic_pranet(out: str | os.PathLike, n_train: int = 12, n_test: int = 4, size: tuple[int, int] = (32, 32),
                           seed: int = 0, empty_fraction: float = 0.0) -> Path:
    """Write a raw PraNet-layout folder of synthetic frames (module docstring).

    Args:
        out: folder to create (must not exist or be empty); it receives ``TrainDataset/`` and ``TestDataset/``.
        n_train: training frames per seen source (Kvasir, CVC-ClinicDB), >= 2.
        n_test: frames per test set (each of the five), >= 1.
        size: ``(H, W)`` in px, each >= 16.
        seed: random seed.
        empty_fraction: share of frames without a polyp, in [0, 1).

    Returns:
        ``out``. Images are RGB PNG, masks PNG ``{0, 255}``.

    Raises:
        MSBError: bad arguments, or ``out`` exists and is not empty.
    """
    out = Path(out)
    for name, v, lo in (("n_train", n_train, 2), ("n_test", n_test, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise MSBError(f"{name} must be an integer >= {lo}, got {v!r}.")
    h, w = int(size[0]), int(size[1])
    if h < 16 or w < 16:
        raise MSBError(f"size must be at least 16x16 pixels, got {h}x{w}.")
    if not 0.0 <= float(empty_fraction) < 1.0:
        raise MSBError(f"empty_fraction must be in [0, 1), got {empty_fraction!r}.")
    if out.exists() and any(out.iterdir()):
        raise MSBError(f"{out} already exists and is not empty; choose an empty folder.")

    def put(folder: Path, img_dir: str, msk_dir: str, stem: str, rgb: np.ndarray, mask: np.ndarray) -> None:
        atomic_write_bytes(folder / img_dir / f"{stem}.png", _png(np.ascontiguousarray(rgb[:, :, ::-1])))
        atomic_write_bytes(folder / msk_dir / f"{stem}.png", _png(mask))

    for src in _TRAIN_SOURCES:
        for i, (rgb, mask) in enumerate(_frames(src, n_train, (h, w), seed, empty_fraction)):
            stem = f"cju{i:04d}synth" if src == "Kvasir" else str(i + 1)
            put(out / "TrainDataset", "image", "mask", stem, rgb, mask)
    for src in SOURCE_SHIFT:
        for i, (rgb, mask) in enumerate(_frames(src, n_test, (h, w), seed + 1000, empty_fraction)):
            put(out / "TestDataset" / src, "images", "masks", str(i + 1), rgb, mask)
    return out


def convert_synthetic_pranet(source: str | os.PathLike | None, out: str | os.PathLike, *, n_train: int = 12,
                             n_test: int = 4, size: tuple[int, int] = (32, 32), seed: int = 0,
                             empty_fraction: float = 0.0, test_sets: list[str] | None = None, train: bool = True,
                             val_fraction: float = 0.2, overwrite: bool = False) -> ConversionReport:
    """Converter ``synthetic-pranet``: :func:`write_synthetic_pranet` into a temporary folder, then
    :func:`~msb.data.converters.pranet.convert_pranet` of it into ``out`` (``source`` is ignored).

    Args:
        source: ignored (the frames are generated).
        out: prepared-dataset folder.
        n_train, n_test, size, seed, empty_fraction: as :func:`write_synthetic_pranet`.
        test_sets, train, val_fraction: as :func:`~msb.data.converters.pranet.convert_pranet` (``val_fraction``
            of the training frames moved to ``val``, seed ``seed``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        The PraNet converter's :class:`ConversionReport`, with a note on the generator.

    Raises:
        MSBError: bad arguments (as the two functions).
    """
    from msb.data.converters.pranet import convert_pranet

    with tempfile.TemporaryDirectory(prefix="msb-synthetic-pranet-") as tmp:
        raw = write_synthetic_pranet(Path(tmp) / "raw", n_train, n_test, size, seed, empty_fraction)
        rep = convert_pranet(raw, out, val_fraction=val_fraction if train else 0.0, seed=seed, test_sets=test_sets,
                             train=train, overwrite=overwrite)
    rep.notes.insert(0, f"synthetic PraNet layout: {n_train} train frame(s) per seen source, {n_test} per test set, "
                        f"{size[0]}x{size[1]} px, seed {seed}")
    return rep
