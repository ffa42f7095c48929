"""Every dataset config in configs/datasets/ through the real config layering (a study naming all of them), and,
where ../shared holds the data, preparing it into tmp_path with the config's converter and options (first 6
samples per part: ``limit``) and drawing the config's split from the result."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from msb.config.generate import generate_runs
from msb.data.converters import CONVERTERS, _options_of
from msb.data.converters.fetch import prepare_from_source
from msb.data.schema import load_prepared_dataset, read_mask
from msb.data.splits import resolve_splits

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
#: datasets issue 12 names -> (converter, foreground classes of the prepared dataset)
EXPECTED = {
    "kvasir_seg": ("kvasir-seg", ["polyp"]), "cvc_clinicdb": ("cvc-clinicdb", ["polyp"]),
    "cvc_colondb": ("cvc-colondb", ["polyp"]), "etis_larib": ("etis-larib", ["polyp"]),
    "cvc_300": ("cvc-300", ["polyp"]), "bkai_igh": ("bkai-igh-neopolyp", ["neoplastic", "non_neoplastic"]),
    "bkai_igh_polyp": ("bkai-igh-neopolyp", ["polyp"]), "isic2018": ("isic2018-task1", ["lesion"]),
    "busi": ("busi", ["lesion"]), "isic2017_shared": ("isic2018-task1", ["lesion"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    study = tmp_path_factory.mktemp("cfg") / "study.yaml"
    names = sorted(p.stem for p in (CONFIGS / "datasets").glob("*.yaml"))
    assert set(EXPECTED) <= set(names)
    study.write_text(yaml.safe_dump({"study": "all_datasets", "configs_root": str(CONFIGS), "datasets": names,
                                     "architectures": ["unet_r18"]}))
    return {r.dataset: r for r in generate_runs(study)}


def test_every_dataset_config_layers_and_names_a_valid_converter(runs):
    for name, run in runs.items():
        prep = run.config.data.prepare
        assert prep is not None and prep.converter in CONVERTERS, name
        assert set(prep.options) <= set(_options_of(CONVERTERS[prep.converter])), name
        # a *_224 config is its dataset at the semi-supervised cards' input size: same prepared dataset
        base = name.removesuffix("_224")
        assert run.config.data.name == base and run.config.data.root == f"datasets/{base}", name
        if base != name:
            assert list(run.config.data.input_size) == [224, 224], name
    for name, (converter, _) in EXPECTED.items():
        assert runs[name].config.data.prepare.converter == converter


@pytest.mark.parametrize("name", ["kvasir_seg", "cvc_colondb", "bkai_igh", "bkai_igh_polyp", "busi",
                                  "isic2017_shared"])
def test_shared_datasets_prepare_from_their_config(runs, tmp_path, shared_dir, name):
    prep = runs[name].config.data.prepare
    source = (REPO / prep.source).resolve()
    if not source.is_dir():
        pytest.skip(f"{source} not present in ../shared")
    opts = {k: (str((REPO / v).resolve()) if k == "groups_csv" else v) for k, v in prep.options.items()}
    limit = 40 if name == "cvc_colondb" else 6  # 40 frames span sequences 1, 2, 3, 5 (six lie in one: one group)
    prepare_from_source(prep.converter, str(source), tmp_path / name, limit=limit, **opts)
    ds = load_prepared_dataset(tmp_path / name, check_mask_values=True)
    assert [c.name for c in ds.foreground_classes] == EXPECTED[name][1]
    assert len(ds.index) == limit
    sp = runs[name].config.data.split
    split = resolve_splits(ds.index, sp.mode, sp.val_fraction, sp.test_fraction, sp.seed, sp.group_column)
    assert set(split) == {"train", "val", "test"}
    if name == "isic2017_shared":  # ISIC_<id>.jpg paired with ISIC_<id>_segmentation.png
        assert ds.index["source"].eq("isic2017-part1").all() and all(s.startswith("ISIC_") for s in ds.sample_ids)
        sid = ds.sample_ids[0]
        ref = np.asarray(Image.open(source / "masks" / f"{sid}_segmentation.png").convert("L"))
        assert np.array_equal(read_mask(ds.mask_path(sid)), np.where(ref > 127, 255, 0))
    if name == "cvc_colondb":  # groups from the README's frame table = the shared index's sequence, 11+15 merged
        shared = pd.read_csv(source / "index.csv", dtype=str).set_index("frame")["sequence"]
        want = ("seq" + shared.loc[ds.sample_ids]).replace({"seq11": "seq11+15", "seq15": "seq11+15"})
        assert ds.index["group"].tolist() == want.tolist() and ds.index["group"].nunique() == 4
    if name.startswith("bkai"):  # groups from the shared index.csv (near_dup_group), keyed by its image path
        shared = pd.read_csv(source / "index.csv", dtype=str).set_index("image")["near_dup_group"]
        want = [shared[f"images/{Path(p).name}"] for p in ds.index["image_path"]]
        assert ds.index["group"].tolist() == want
        sid = ds.sample_ids[0]
        rgb = np.asarray(Image.open(source / "masks" / Path(ds.index["image_path"].iloc[0]).name).convert("RGB"))
        polyp = (rgb[..., 0] > 127) | (rgb[..., 1] > 127)  # PROVENANCE.md: max(R, G) > 127
        assert np.array_equal(read_mask(ds.mask_path(sid)) > 0, polyp)
