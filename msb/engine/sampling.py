"""Per-epoch batches for multi-process training and DataLoader workers.

:class:`EpochBatchSampler` draws the epoch's order exactly as the single-process trainer's
``DataLoader(shuffle=True, generator=torch.Generator().manual_seed(seed))`` does, cuts it into the same global
batches of ``train.batch_size``, and gives each rank its contiguous slice of every global batch, so that one
optimizer step of N processes sees exactly the images of one step of a single process (PyTorch's
``DistributedSampler`` interleaves ``perm[rank::N]`` over the whole epoch instead, which puts different images
into each step). Every index comes with its own augmentation seed (a fixed function of the epoch seed and the
index), so augmentation does not depend on which rank or DataLoader worker loads the image, and persistent
workers see each epoch's seed although their copy of the dataset is never updated.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, Sampler

__all__ = ["EpochBatchSampler", "epoch_order", "sample_seed"]


def epoch_order(n: int, batch_size: int, seed: int, drop_last: bool) -> list[list[int]]:
    """The global batches (lists of indices into the dataset) of one epoch of the single-process trainer:
    what ``DataLoader(range(n), batch_size, shuffle=True, generator=Generator().manual_seed(seed),
    drop_last=drop_last)`` yields (the DataLoader's own draw of a worker base seed included)."""
    loader = DataLoader(range(n), batch_size=batch_size, shuffle=True, drop_last=drop_last,
                        generator=torch.Generator().manual_seed(seed))
    return [b.tolist() for b in loader]


def sample_seed(epoch_seed: int, index: int) -> int:
    """Augmentation seed of dataset item ``index`` in the epoch seeded by ``epoch_seed`` (31-bit)."""
    return (epoch_seed * 1_000_003 + index * 7_919 + 1) % (2**31 - 1)


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batch sampler: this rank's share of each global batch, as ``(index, augmentation seed)`` pairs.

    A global batch of ``m`` images is split into ``world_size`` contiguous parts of ``m // world_size`` or one
    more (``torch.tensor_split``); a trailing global batch with fewer images than processes is dropped (every rank
    must take part in each step). Call :meth:`set_epoch` with the epoch seed before iterating.

    Args:
        n: dataset length; batch_size: the global batch; rank, world_size: this process; drop_last: as the
            single-process trainer (drop a trailing batch of one image, BatchNorm needs two).
    """

    def __init__(self, n: int, batch_size: int, rank: int = 0, world_size: int = 1, drop_last: bool = False) -> None:
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world_size
        self.drop_last = drop_last
        self.seed = 0
        self.global_sizes: list[int] = []

    def set_epoch(self, seed: int) -> None:
        """Use the epoch seed ``seed`` (:func:`msb.engine.determinism.epoch_seed`) for the next iteration."""
        self.seed = seed

    def _batches(self) -> list[list[int]]:
        return [b for b in epoch_order(self.n, self.batch_size, self.seed, self.drop_last) if len(b) >= self.world]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        batches = self._batches()
        self.global_sizes = [len(b) for b in batches]
        for b in batches:
            part = torch.tensor_split(torch.tensor(b), self.world)[self.rank].tolist()
            yield [(i, sample_seed(self.seed, i)) for i in part]

    def __len__(self) -> int:
        return len(self._batches())
