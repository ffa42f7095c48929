"""Benchmark: the trainer's training throughput against a bare PyTorch loop, in one run.

Both train the same model (U-Net, ResNet-18 encoder, random init) on the same synthetic images at the same
input size and batch size, with the same loss (structure loss) and optimizer (AdamW), and the *same input
pipeline*: the preprocessing cache's arrays, :class:`msb.data.torch_dataset.SegmentationDataset` with the same
albumentations flips (:func:`~msb.data.torch_dataset.build_augmentation`), a shuffling ``DataLoader`` with the
same batch size and workers. The bare loop then does only: forward, loss, backward, clip, step. The trainer
adds progress hooks, multi-scale/batch transforms, non-finite checks and per-epoch bookkeeping; its images/s
are taken from the timed training phase of each epoch (validation and checkpointing excluded, as they are
not part of the bare loop). Value check: both loops see the same number of images per epoch.

Bare epochs alternate with the trainer's epochs in the same process (via the trainer's ``on_epoch_end`` hook),
so a change in machine load affects both alike.
Prints images/s of both, the time ratio (bare / trainer throughput = trainer time / bare time; <= 1: the
trainer is at least as fast). ``--quick``: 16 images at 64x64, 2 epochs (CI smoke test).

Usage: ``.venv/bin/python scripts/bench_train.py [--quick] [--size 128] [--n 64] [--epochs 3] [--batch-size 8]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.schema import load_prepared_dataset
from msb.data.splits import read_split_file
from msb.data.torch_dataset import SegmentationDataset, build_augmentation
from msb.data.synth import make_synthetic_dataset
from msb.engine.determinism import seed_everything
from msb.engine.losses import multi_output_loss
from msb.engine.runner import ensure_split, train_run
from msb.models.registry import build_model


class BareLoop:
    """A minimal training loop with the same model, loss, optimizer and clipping as the trainer."""

    def __init__(self, data: SegmentationDataset, n_classes: int, cfg: RunConfig) -> None:
        seed_everything(0)
        self.data, self.cfg = data, cfg
        self.model = build_model(cfg.model, n_classes)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.optimizer.lr,
                                     weight_decay=cfg.train.optimizer.weight_decay)

    def epoch(self) -> float:
        """Run one epoch; return images/s."""
        bs = self.cfg.train.batch_size
        n = len(self.data)
        loader = torch.utils.data.DataLoader(self.data, batch_size=bs, shuffle=True,
                                             num_workers=self.cfg.data.num_workers, drop_last=(n % bs == 1 and n > 1))
        fmt = torch.channels_last if self.cfg.train.channels_last else torch.contiguous_format
        t0 = time.perf_counter()
        seen = 0
        for x, y, _ in loader:
            x = x.contiguous(memory_format=fmt)
            seen += len(x)
            self.opt.zero_grad(set_to_none=True)
            loss = multi_output_loss(self.model(x), y, "structure", "weighted")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip.max)
            self.opt.step()
        self.seen = seen
        return seen / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--n", type=int, default=64, help="training images")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="16 images at 64x64, 2 epochs (CI smoke test)")
    args = ap.parse_args(argv)
    if args.quick:
        args.size, args.n, args.epochs = 64, 16, 2

    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        n_total = int(args.n / 0.6) + 1
        make_synthetic_dataset(tmp / "data", n_samples=n_total, size=(args.size, args.size), seed=0)
        cfg = RunConfig.model_validate({
            "study": "bench", "run_root": str(tmp / "runs"), "random_seed": 0,
            "data": {"name": "synthetic", "root": str(tmp / "data"), "input_size": [args.size, args.size],
                     "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0,
                               "group_column": None},
                     "max_samples_per_split": args.n},
            "model": {"arch": "unet", "encoder": "resnet18"},
            "train": {"epochs": args.epochs, "batch_size": args.batch_size, "device": "cpu",
                      "augment": {"hflip": 0.5, "vflip": 0.5}},
        })
        ds = load_prepared_dataset(tmp / "data")
        run = GeneratedRun("bench", cfg, config_hash(cfg), "synthetic", "unet")
        run_dir = tmp / "runs" / "bench"
        ensure_split(cfg, ds, run_dir)
        splits = read_split_file(run_dir / "split.csv")
        train_ids = sorted(str(k) for k, v in splits.items() if v == "train")[: args.n]
        n_train = len(train_ids)
        cache = build_cache(ds, (args.size, args.size), cfg.data.cache_dir)
        a = cfg.train.augment
        aug = build_augmentation(a.hflip, a.vflip, a.rotate90, a.brightness_contrast, seed=cfg.random_seed)
        data = SegmentationDataset(cache, train_ids, cfg.data.normalize_mean, cfg.data.normalize_std, aug)
        bare_loop = BareLoop(data, len(ds.foreground_classes), cfg)
        # one bare epoch, then the trainer with one bare epoch after each of its epochs (on_epoch_end), so the
        # two alternate in one process and a change in machine load affects both alike
        bare = [bare_loop.epoch()]

        def interleave(_info: dict) -> None:
            bare.append(bare_loop.epoch())

        result = train_run(run, run_dir, ds, on_epoch_end=interleave)
        framework = [h["train_images_per_s"] for h in result.history]

    # the first epoch of each warms up allocators and kernels: report the median of the others
    f = statistics.median(framework[1:] or framework)
    b = statistics.median(bare[1:] or bare)
    print(f"setup: U-Net/ResNet-18, {n_train} training images at {args.size}x{args.size}, batch {args.batch_size}, "
          f"{args.epochs} epochs, {torch.get_num_threads()} threads, CPU")
    print(f"bare PyTorch loop : {b:8.2f} images/s  (per epoch: {', '.join(f'{r:.2f}' for r in bare)})")
    print(f"msb trainer       : {f:8.2f} images/s  (per epoch: {', '.join(f'{r:.2f}' for r in framework)})")
    print(f"ratio ours / bare loop (time per image): {b / f:.3f}  (throughput trainer/bare {f / b:.3f}; "
          f"{'ours at least as fast' if b / f <= 1 else 'ours SLOWER'})")
    same = bare_loop.seen == n_train
    print(f"value check: images per epoch, trainer {n_train}, bare loop {bare_loop.seen}: "
          f"{'EQUAL' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
