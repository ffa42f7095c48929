"""Benchmark: ``msb evaluate`` (+ metrics per image) against a plain evaluation script, same checkpoint.

Set-up (not timed): a synthetic prepared dataset (``--native`` px images, ``--n-test`` test images), a U-Net
(ResNet-18 encoder, random init) trained for one epoch on 16 images at ``--size`` px, so that ``best.pt``
exists with its record. Then, repeats interleaved:

* ours: :func:`msb.evaluation.evaluator.evaluate_checkpoint` (checkpoint SHA-256 check, cached inputs,
  batched forward, bilinear upsampling to the native size, threshold, counts, compressed prediction files,
  metrics.parquet with HD95/NSD per image, digests.json, staged folder swap);
* plain script: the same checkpoint loaded with ``torch.load``, the same cached inputs and normalisation, the
  same batched forward (channels-last when the run uses it), upsampling and threshold, NumPy TP/FP/FN per
  image and medpy ``hd95`` per image with both masks non-empty; nothing written.

Value check: the plain script's TP/FP/FN equal every row of ours' ``counts.parquet`` exactly. The script does
the same forward as ``msb evaluate`` (a fair competitor predicts what it evaluates): the same batches in the same
order (``train.batch_size``, the sorted test ids), the same float32 normalisation arithmetic as the training
``Dataset`` (``(x - 255 mean) * (1 / (255 std))``; dividing by ``255 std`` instead rounds some inputs
differently), the same memory format, so the logits and the counts are bit-identical.

Usage: ``python scripts/bench_eval.py [--quick] [--n-test 100] [--repeats 3] [--json OUT]``; ``--quick`` = 16 test
images, 1 repeat.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_common import Row, interleave, print_row  # noqa: E402

from msb.config.generate import GeneratedRun, config_hash  # noqa: E402
from msb.config.schema import RunConfig  # noqa: E402
from msb.data.cache import build_cache  # noqa: E402
from msb.data.schema import load_prepared_dataset, mask_to_onehot, read_mask  # noqa: E402
from msb.data.splits import read_split_file  # noqa: E402
from msb.data.synth import make_synthetic_dataset  # noqa: E402
from msb.engine.runner import ensure_split, train_run  # noqa: E402
from msb.evaluation.evaluator import evaluate_checkpoint  # noqa: E402
from msb.models.registry import build_model  # noqa: E402


def plain_script(run_dir: Path, cfg: RunConfig, ds, ids: list[str]) -> pd.DataFrame:
    """What a user writes: load the checkpoint, predict the cached inputs in batches, count with NumPy."""
    from medpy.metric.binary import hd95

    payload = torch.load(run_dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=False)
    model = build_model(cfg.model, len(ds.foreground_classes))
    model.load_state_dict(payload["model"])
    model.eval()
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir)
    # the arithmetic of msb's Dataset (float32 mean * 255, reciprocal of 255 std): bit-identical inputs
    mean = (np.asarray(cfg.data.normalize_mean, dtype=np.float32) * 255.0).reshape(1, 1, 3)
    inv_std = (1.0 / (np.asarray(cfg.data.normalize_std, dtype=np.float32) * 255.0)).reshape(1, 1, 3)
    fmt = torch.channels_last if cfg.train.channels_last else torch.contiguous_format
    rows, bs = [], cfg.train.batch_size
    with torch.no_grad():
        for s in range(0, len(ids), bs):
            batch = ids[s:s + bs]
            x = torch.from_numpy(np.stack([np.ascontiguousarray(
                ((np.asarray(cache.images[cache.row_of[i]]).astype(np.float32) - mean) * inv_std).transpose(2, 0, 1))
                for i in batch])).contiguous(memory_format=fmt)
            logits = model.predict_logits(x).float()
            for k, sid in enumerate(batch):
                mpath = ds.mask_path(sid)
                ref = mask_to_onehot(read_mask(mpath), ds.classes, mpath)
                up = F.interpolate(logits[k:k + 1], size=ref.shape[-2:], mode="bilinear", align_corners=False)[0]
                prob = torch.sigmoid(up)
                pred = (prob >= cfg.evaluation.threshold).numpy()
                for c in range(pred.shape[0]):
                    p, r = pred[c], ref[c]
                    tp = int(np.count_nonzero(p & r))
                    rows.append({"image_id": sid, "class_id": ds.foreground_classes[c].class_id, "tp": tp,
                                 "fp": int(np.count_nonzero(p)) - tp, "fn": int(np.count_nonzero(r)) - tp,
                                 "hd95": hd95(p, r) if p.any() and r.any() else np.nan})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 test images, 1 repeat (CI smoke test)")
    ap.add_argument("--n-test", type=int, default=100)
    ap.add_argument("--size", type=int, default=96, help="model input size (px)")
    ap.add_argument("--native", type=int, default=192, help="native image size of the synthetic data (px)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.n_test, args.repeats = 16, 1
    with tempfile.TemporaryDirectory(prefix="msb_bench_eval_") as tmp_s:
        tmp = Path(tmp_s)
        n_total = int((16 + args.n_test) / 0.6) + 10
        make_synthetic_dataset(tmp / "data", n_samples=n_total, size=(args.native, args.native), seed=0)
        cfg = RunConfig.model_validate({
            "study": "bench", "run_root": str(tmp / "runs"), "random_seed": 0,
            "data": {"name": "synthetic", "root": str(tmp / "data"), "input_size": [args.size, args.size],
                     "split": {"mode": "random", "val_fraction": 0.1, "test_fraction": 0.6, "seed": 0,
                               "group_column": None},
                     "max_samples_per_split": max(16, args.n_test)},
            "model": {"arch": "unet", "encoder": "resnet18"},
            "train": {"epochs": 1, "batch_size": 8, "device": "cpu"},
        })
        ds = load_prepared_dataset(tmp / "data")
        run_dir = tmp / "runs" / "bench"
        run = GeneratedRun("bench", cfg, config_hash(cfg), "synthetic", "unet")
        ensure_split(cfg, ds, run_dir)
        train_run(run, run_dir, ds)
        splits = read_split_file(run_dir / "split.csv")
        # the images msb evaluates: the test split, sorted, cut at data.max_samples_per_split
        ids = sorted(s for s, sp in splits.items() if sp == "test")[: cfg.data.max_samples_per_split]
        row = Row(f"evaluation (forward + counts + HD95/NSD per image), {len(ids)} test images "
                  f"{args.native}x{args.native}, input {args.size}x{args.size}, CPU")
        vals = interleave(row, {
            "ours": lambda: evaluate_checkpoint(run_dir, cfg, ds, "best", "bench", run.config_hash),
            "plain script": lambda: plain_script(run_dir, cfg, ds, ids)}, args.repeats)
        ours = pd.read_parquet(vals["ours"].counts_path)
        m = ours.merge(vals["plain script"], on=["image_id", "class_id"], suffixes=("", "_plain"))
        exact = (m["tp"] == m["tp_plain"]) & (m["fp"] == m["fp_plain"]) & (m["fn"] == m["fn_plain"])
        row.equal = len(m) == len(ours) == len(vals["plain script"]) and bool(exact.all())
        d = sum((m[c] - m[f"{c}_plain"]).abs().sum() for c in ("tp", "fp", "fn"))
        row.check = (f"{len(m)} of {len(ours)} (image, class) rows matched; identical TP/FP/FN (exact) in "
                     f"{int(exact.sum())} ({int(d)} differing pixel count(s) in all)")
        row.notes.append("ours also writes compressed prediction files, metrics.parquet and digests.json")
        print_row(row)
        if args.json:
            args.json.write_text(json.dumps([row.as_dict()], indent=2) + "\n")
    return 0 if row.equal else 1


if __name__ == "__main__":
    raise SystemExit(main())
