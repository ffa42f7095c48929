"""PyTorch ``Dataset`` over the preprocessing cache, with albumentations augmentation for training."""

from __future__ import annotations

from typing import Sequence

import albumentations as A
import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from msb.data.cache import CachedArrays

__all__ = ["SegmentationDataset", "UnlabelledImageDataset", "build_augmentation", "labelled_datasets"]


def build_augmentation(hflip: float = 0.0, vflip: float = 0.0, rotate90: float = 0.0,
                       brightness_contrast: float = 0.0, seed: int = 0) -> A.Compose | None:
    """Albumentations pipeline from probabilities (each in [0, 1]); ``None`` when all are 0.

    ``RandomRotate90`` is applied only to square inputs (it would swap H and W otherwise)."""
    ops: list[A.BasicTransform] = []
    if hflip > 0:
        ops.append(A.HorizontalFlip(p=hflip))
    if vflip > 0:
        ops.append(A.VerticalFlip(p=vflip))
    if rotate90 > 0:
        ops.append(A.RandomRotate90(p=rotate90))
    if brightness_contrast > 0:
        ops.append(A.RandomBrightnessContrast(p=brightness_contrast))
    if not ops:
        return None
    return A.Compose(ops, seed=seed)


class _CachedImages(Dataset):
    """The images of some cache rows, normalised and optionally augmented: what both datasets below share.

    ``rows`` int64 (N,) cache rows of ``sample_ids``; images uint8 (H, W, 3) are normalised as
    ``(x - 255 mean) / (255 std)`` per channel to float32 (3, H, W).
    """

    def __init__(self, cache: CachedArrays, sample_ids: Sequence[str], mean: Sequence[float],
                 std: Sequence[float], augment: A.Compose | None = None) -> None:
        row_of = cache.row_of
        self.rows = np.array([row_of[s] for s in sample_ids], dtype=np.int64)
        self.sample_ids = list(sample_ids)
        self.images = cache.images  # the images only: a subclass that needs masks keeps them itself
        self.augment = augment
        self.mean = (np.asarray(mean, dtype=np.float32) * 255.0).reshape(1, 1, 3)
        self.inv_std = (1.0 / (np.asarray(std, dtype=np.float32) * 255.0)).reshape(1, 1, 3)

    def __len__(self) -> int:
        return len(self.rows)

    def set_epoch_seed(self, seed: int) -> None:
        """Reseed the augmentation so each epoch's draws depend only on (run seed, epoch)."""
        if self.augment is not None:
            self.augment.set_random_seed(seed)

    def _to_tensor(self, img: np.ndarray) -> torch.Tensor:
        """uint8 (H, W, 3) -> normalised float32 (3, H, W)."""
        x = (img.astype(np.float32) - self.mean) * self.inv_std
        return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))


class SegmentationDataset(_CachedImages):
    """Samples of one split, read from the cache.

    ``__getitem__`` returns ``(image, mask, index)``: image float32 (3, H, W) normalised with ``mean``/``std``
    (ImageNet defaults), mask float32 (C, H, W) in {0, 1}, and the position in ``sample_ids``. The key is the
    position ``i`` or a pair ``(i, seed)`` (from :class:`msb.engine.sampling.EpochBatchSampler`): the augmentation
    of that item is then drawn from ``seed`` alone, whichever process or DataLoader worker loads it.
    """

    def __init__(self, cache: CachedArrays, sample_ids: Sequence[str], mean: Sequence[float],
                 std: Sequence[float], augment: A.Compose | None = None) -> None:
        super().__init__(cache, sample_ids, mean, std, augment)
        self.masks = cache.masks

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        if isinstance(key, tuple):
            i, seed = key
            if self.augment is not None:
                self.augment.set_random_seed(seed)
        else:
            i = key
        r = self.rows[i]
        img = np.asarray(self.images[r])
        mask = np.asarray(self.masks[r]).transpose(1, 2, 0)  # (H, W, C)
        if self.augment is not None:
            out = self.augment(image=img, mask=mask)
            img, mask = out["image"], out["mask"]
        y_t = torch.from_numpy(mask.transpose(2, 0, 1).astype(np.float32))
        return self._to_tensor(img), y_t, i


class UnlabelledImageDataset(_CachedImages):
    """Images of the unlabelled training rows, without their masks: no mask of an unlabelled row can reach a loss.

    The masks stay on disk (and in the cache), but this class never holds a reference to the cache's mask
    array, and ``__getitem__`` returns ``{"image": float32 (3, H, W), "index": int}``: there is no mask key at
    all, so a loss that asks for one fails instead of silently using it. Augmentations are applied to the image
    only (albumentations ``augment(image=...)``).
    """

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, object]:
        """``key``: the position ``i`` or ``(i, seed)`` (the augmentation of that item drawn from ``seed``)."""
        i, seed = key if isinstance(key, tuple) else (key, None)
        if seed is not None and self.augment is not None:
            self.augment.set_random_seed(seed)
        img = np.asarray(self.images[self.rows[i]])
        if self.augment is not None:
            img = self.augment(image=img)["image"]
        return {"image": self._to_tensor(img), "index": i}


def labelled_datasets(cache: CachedArrays, labelled: pd.Series, mean: Sequence[float], std: Sequence[float],
                      augment: A.Compose | None = None) -> tuple[SegmentationDataset, UnlabelledImageDataset]:
    """Split the training rows into a labelled dataset (images + masks) and an unlabelled one (images only).

    Args:
        cache: the preprocessing cache.
        labelled: bool Series indexed by training ``sample_id`` (``msb.data.labelled``), True = labelled.
        mean, std: normalisation (as :class:`SegmentationDataset`).
        augment: training augmentation, shared by both (the unlabelled set applies it to images only).

    Returns:
        ``(labelled_ds, unlabelled_ds)``; their sample ids are disjoint and together are ``labelled.index``.

    Raises:
        ValueError: no labelled row.
    """
    flags = labelled.astype(bool)
    lab = [str(s) for s, v in flags.items() if v]
    unl = [str(s) for s, v in flags.items() if not v]
    if not lab:
        raise ValueError("labelled_datasets: no labelled training row")
    return (SegmentationDataset(cache, lab, mean, std, augment),
            UnlabelledImageDataset(cache, unl, mean, std, augment))
