"""Benchmark: the trainer's training throughput against a bare PyTorch loop, in one run.

Both train the same model (U-Net, ResNet-18 encoder, random init) on the same synthetic images at the same
input size and batch size, with the same loss (structure loss) and optimizer (AdamW). The bare loop holds
the whole (already normalised) dataset as one tensor and does only: shuffle, forward, loss, backward,
clip, step. The trainer goes through the preprocessing cache, the Dataset/DataLoader, augmentation,
progress hooks and per-epoch bookkeeping; its images/s are taken from the timed training phase of each epoch
(validation and checkpointing excluded, as they are not part of the bare loop).

Bare epochs alternate with the trainer's epochs in the same process (via the trainer's ``on_epoch_end`` hook),
so a change in machine load affects both alike.
Prints images/s of both and the ratio (trainer / bare). Target: overhead <= 10 %, i.e. ratio >= 0.90.

Usage: ``.venv/bin/python scripts/bench_train.py [--size 128] [--n 64] [--epochs 3] [--batch-size 8]``
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
from msb.data.synth import make_synthetic_dataset
from msb.engine.determinism import seed_everything
from msb.engine.losses import multi_output_loss
from msb.engine.runner import ensure_split, train_run
from msb.models.registry import build_model


class BareLoop:
    """A minimal training loop with the same model, loss, optimizer and clipping as the trainer."""

    def __init__(self, images: torch.Tensor, masks: torch.Tensor, cfg: RunConfig) -> None:
        seed_everything(0)
        self.images, self.masks, self.cfg = images, masks, cfg
        self.model = build_model(cfg.model, masks.shape[1])
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.optimizer.lr,
                                     weight_decay=cfg.train.optimizer.weight_decay)

    def epoch(self) -> float:
        """Run one epoch; return images/s."""
        bs = self.cfg.train.batch_size
        perm = torch.randperm(len(self.images))
        t0 = time.perf_counter()
        for i in range(0, len(self.images), bs):
            idx = perm[i: i + bs]
            x, y = self.images[idx], self.masks[idx]
            self.opt.zero_grad(set_to_none=True)
            loss = multi_output_loss(self.model(x), y, "structure", "weighted")
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip.max)
            self.opt.step()
        return len(self.images) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--n", type=int, default=64, help="training images")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()

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
        cache = build_cache(ds, (args.size, args.size))
        rows = np.array([cache.row_of[s] for s in train_ids])
        mean = np.array(cfg.data.normalize_mean, dtype=np.float32).reshape(1, 3, 1, 1) * 255
        std = np.array(cfg.data.normalize_std, dtype=np.float32).reshape(1, 3, 1, 1) * 255
        images = torch.from_numpy((np.asarray(cache.images[rows]).transpose(0, 3, 1, 2).astype(np.float32) - mean) / std)
        masks = torch.from_numpy(np.asarray(cache.masks[rows]).astype(np.float32))
        # the same memory format as the trainer's input (train.channels_last), so both run the same kernels
        fmt = torch.channels_last if cfg.train.channels_last else torch.contiguous_format
        images = images.contiguous(memory_format=fmt)
        bare_loop = BareLoop(images, masks, cfg)
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
    print(f"ratio trainer/bare: {f / b:.3f}  (overhead {100 * (1 - f / b):+.1f} %; target <= 10 %)")


if __name__ == "__main__":
    main()
