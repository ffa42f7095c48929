"""Released whole-model checkpoints (``model.checkpoint``) and the two loading edge cases.

``fixtures/released_keys.json`` holds the names and shapes of each official model's ``state_dict()`` (read off
the official model classes at the commits it names; no values). A state dict with exactly those names and
shapes, made here with random values, must load; and our own weights written under the official names (the
inverse of the renaming) must give the same outputs after loading.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model
from msb.models.backbones import build_backbone
from msb.models.released import load_released, official_to_ours

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "released_keys.json").read_text())
ARCHS = ["pranet", "polyp_pvt", "sanet", "pvt_cascade", "g_cascade"]
# the two costliest cases (G-CASCADE runs at 352 x 352, the size its fixture was read at; PraNet's 30 M
# parameters) run in the full suite only; ~25 s each on the shared 2-core machine
SLOW = {"pranet", "g_cascade"}
# official keys without a counterpart here: classifier head of the Res2Net, grey-input stems, G-CASCADE's fixed
# relative-position terms (recomputed from img_size)
NOT_OURS = re.compile(r"^(resnet\.fc\.|conv\.|conv_1cto3c\.)|relative_pos$")


def _shape(s: str) -> list[int]:
    return [int(v) for v in s.split("x")] if s else []


def _random(shapes: dict[str, str], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, s in shapes.items():
        if k.endswith("num_batches_tracked"):
            out[k] = torch.tensor(7)
        elif k.endswith("running_var"):
            out[k] = torch.rand(_shape(s), generator=g) + 0.5
        else:
            out[k] = torch.randn(_shape(s), generator=g) * 0.05
    return out


def _cfg(arch: str, **kw) -> ModelConfig:
    return ModelConfig(arch=arch, params={"img_size": 352} if arch == "g_cascade" else {}, **kw)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in ARCHS])
def test_official_names_and_shapes_load_and_match_our_outputs(arch: str, tmp_path: Path):
    keys = FIXTURE[arch]["keys"]
    torch.manual_seed(0)
    ours = build_model(_cfg(arch), 1).eval()
    # the renaming gives the inverse map ours -> official (each tensor is followed by identity)
    official = _random(keys, seed=1)
    by_id = {id(v): k for k, v in official.items()}
    inverse = {mine: by_id[id(v)] for mine, v in official_to_ours(arch, official, ours).items()}
    own = ours.state_dict()
    assert sorted(inverse) == sorted(own), "the renaming must reach every tensor of ours exactly once"
    # 1. a state dict with exactly the official names and shapes (random values) loads, value for value
    path = tmp_path / f"{arch}_official.pth"
    torch.save(official, path)
    if arch == "sanet":  # through the config key once; deep copies for the rest (building is the slow part)
        loaded = build_model(_cfg(arch, checkpoint=str(path)), 1).state_dict()
    else:
        fresh = copy.deepcopy(ours)
        load_released(fresh, path, arch)
        loaded = fresh.state_dict()
    for k, v in loaded.items():
        assert torch.equal(v, official[inverse[k]]), k
    # 2. our weights under the official names ("module." prefixed, as nn.DataParallel saves) give our outputs
    written = {f"module.{inverse[k]}": v for k, v in own.items()}
    for k in keys:
        if NOT_OURS.search(k):
            written[f"module.{k}"] = official[k]
    assert {k[len("module."):] for k in written} == set(keys)
    assert all(list(v.shape) == _shape(keys[k[len("module."):]]) for k, v in written.items())
    path2 = tmp_path / f"{arch}_ours_as_official.pth"
    torch.save(written, path2)
    again = copy.deepcopy(ours)
    for p in again.parameters():  # forget our values: only the file may bring them back
        torch.nn.init.zeros_(p)
    load_released(again, path2, arch)
    again.eval()
    size = 352 if arch == "g_cascade" else 64
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(again.predict_logits(x), ours.predict_logits(x))


def test_wrong_file_is_one_line_with_abridged_key_lists(tmp_path: Path):
    official = _random(FIXTURE["polyp_pvt"]["keys"], seed=3)
    path = tmp_path / "PraNet-19.pth"
    torch.save(official, path)
    with pytest.raises(MSBError) as err:
        build_model(_cfg("pranet", checkpoint=str(path)), 1)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{path}: weights do not match PraNet: ")
    n_missing = len(build_model(_cfg("pranet"), 1).state_dict())  # nothing of PraNet is in a Polyp-PVT file
    assert f"{n_missing} missing key(s): " in msg and "unexpected key(s): " in msg
    listed = re.search(r"missing key\(s\): ([^;]*)", msg).group(1).split(", ")
    assert len(listed) == 10


def test_gcascade_file_of_another_input_size_is_refused(tmp_path: Path):
    path = tmp_path / "gcascade.pth"
    torch.save(_random(FIXTURE["g_cascade"]["keys"], seed=4), path)
    with pytest.raises(MSBError, match=r"relative_pos has shape .* trained at another input size; set "
                                       r"model\.params\.img_size"):
        build_model(ModelConfig(arch="g_cascade", params={"img_size": 128}, checkpoint=str(path)), 1)


def test_module_prefixed_official_pvt_file_loads(tmp_path: Path):
    """Edge case 1: ``module.`` is stripped before the official PVTv2 names are renamed."""
    official = {k[len("backbone."):]: v for k, v in _random(FIXTURE["polyp_pvt"]["keys"], seed=5).items()
                if k.startswith("backbone.")}
    assert "block1.0.attn.q.weight" in official and "patch_embed1.proj.weight" in official
    path = tmp_path / "pvt_v2_b2.pth"
    torch.save({f"module.{k}": v for k, v in official.items()}, path)
    got = build_backbone("pvt_v2_b2", str(path)).model.state_dict()
    assert torch.equal(got["stages.0.blocks.0.attn.q.weight"], official["block1.0.attn.q.weight"])
    assert torch.equal(got["stages.3.downsample.proj.weight"], official["patch_embed4.proj.weight"])
    assert torch.equal(got["stages.1.blocks.2.mlp.dwconv.weight"], official["block2.2.mlp.dwconv.dwconv.weight"])


def test_res2net_file_without_num_batches_tracked_loads_as_pytorch_does(tmp_path: Path):
    """Edge case 2: a file written before PyTorch 0.4.1 has no ``num_batches_tracked``; PyTorch's own strict
    load of such a dict (no version metadata) accepts it and keeps the module's counters."""
    full = {k[len("resnet."):]: v for k, v in _random(FIXTURE["pranet"]["keys"], seed=6).items()
            if k.startswith("resnet.") and not k.startswith("resnet.fc.")}
    old = {k: v for k, v in full.items() if not k.endswith("num_batches_tracked")}
    assert len(full) - len(old) == 87  # one counter per BatchNorm of the Res2Net-50 v1b
    reference = build_backbone("res2net50_v1b").model
    torch.nn.Module.load_state_dict(reference, dict(old), strict=True)  # PyTorch accepts it
    path = tmp_path / "res2net50_v1b_26w_4s-3cf99910.pth"
    torch.save(old, path)
    got = build_backbone("res2net50_v1b", str(path)).model.state_dict()
    ref = reference.state_dict()
    assert got.keys() == ref.keys()
    for k in ref:
        assert torch.equal(got[k], ref[k]), k
    assert int(got["bn1.num_batches_tracked"]) == 0
