"""Released whole-model checkpoints of the polyp adapters (``model.checkpoint: FILE``).

The authors of PraNet, Polyp-PVT, SANet, PVT-CASCADE and G-CASCADE publish ``model.state_dict()`` files of their
own module trees (``PraNet-19.pth``, ``PolypPVT.pth``, SANet's ``model-128``, the CASCADE family's
``*.pth``). :func:`official_to_ours` renames such a state dict to the parameter names of our adapters with the
rules of :data:`RULES` (facts read off the official model definitions, listed per architecture in
``docs/models.md``); :func:`load_released` loads it strictly.

Official names, per repository (the module tree of the official class; the fixture
``tests/models/fixtures/released_keys.json`` lists every name and shape):

- ``pranet`` (``DengPingFan/PraNet`` ``lib/PraNet_Res2Net.py``, class ``PraNet``): ``resnet.*`` (Res2Net-50 v1b,
  the same names as ours below ``backbone.model.``; ``resnet.fc`` is the unused classifier, dropped),
  ``rfb{2,3,4}_1``, ``agg1``, ``ra4_conv1..5``, ``ra3_conv1..4``, ``ra2_conv1..4``; every ``BasicConv2d`` has
  ``.conv`` / ``.bn`` where our :class:`~msb.models.zoo.blocks.ConvBN` has ``.0`` / ``.1``.
- ``polyp_pvt`` (``DengPingFan/Polyp-PVT`` ``lib/pvt.py``, ``PolypPVT``): ``backbone.*`` (official PVTv2 names),
  ``Translayer*``, ``CFM``, ``ca``, ``sa.conv1``, ``SAM``, ``out_SAM``, ``out_CFM``.
- ``sanet`` (``weijun88/SANet`` ``src/model.py``, ``Model``): ``bkbone.*`` (Res2Net-50 v1b), ``linear{3,4,5}``,
  ``predict``.
- ``pvt_cascade`` (``SLDGroup/CASCADE`` ``lib/networks.py``, ``PVT_CASCADE``): ``conv.*`` (the 1 -> 3 channel
  stem for grey inputs, which we do not build: dropped), ``backbone.*``, ``decoder.{Conv_1x1, ConvBlock*, Up*,
  AG*, CA*, SA}``, ``out_head1..4``.
- ``g_cascade`` (``SLDGroup/G-CASCADE`` ``lib/networks.py``, ``PVT_GCASCADE``): ``conv_1cto3c.*`` (grey stem,
  dropped), ``backbone.*``, ``decoder.gcb*.0.*`` (``graph_conv.gconv.nn.0/1`` = our ``graph_conv.conv/norm``),
  ``decoder.ucb*.up.*``, ``decoder.spa.conv1``, ``out_head1..4``. The frozen ``relative_pos`` terms are
  recomputed here from ``model.params.img_size``; a file whose terms have another shape was trained at another
  input size and is refused.

Prefixes ``module.`` (``nn.DataParallel``) are stripped **before** any renaming. Official PVTv2 backbone names
(``patch_embed1``, ``block1.0``, ``norm1``, ``dwconv.dwconv``) are renamed by timm's
``pvt_v2.checkpoint_filter_fn``. A file already in our names (``model.state_dict()`` of an adapter) loads as is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from msb.errors import MSBError
from msb.models.weights import check_and_load, read_state_dict, remove_prefixes

if TYPE_CHECKING:
    from msb.models.base import Segmentor

__all__ = ["RULES", "DROPPED", "official_to_ours", "load_released", "RELEASED_ARCHS"]

_BN = (r"\.conv\.", ".0."), (r"\.bn\.", ".1.")  # BasicConv2d(.conv, .bn) -> ConvBN(.0, .1)

#: per architecture: (official backbone prefix, (regex, replacement) rules applied in order to the other keys)
RULES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "pranet": ("resnet.", [
        *_BN, (r"^rfb(\d)_1\.branch0\.0\.", r"rfb\1.branch0."), (r"^rfb(\d)_1\.", r"rfb\1."), (r"^agg1\.", "agg."),
        (r"^ra4_conv1\.", "ra4.reduce."), (r"^ra4_conv([234])\.", lambda m: f"ra4.convs.{int(m.group(1)) - 2}."),
        (r"^ra4_conv5\.", "ra4.out."),
        (r"^ra([23])_conv1\.", r"ra\1.reduce."),
        (r"^ra([23])_conv([23])\.", lambda m: f"ra{m.group(1)}.convs.{int(m.group(2)) - 2}."),
        (r"^ra([23])_conv4\.", r"ra\1.out.")]),
    "polyp_pvt": ("backbone.", [
        *_BN, (r"^Translayer", "translayer"), (r"^CFM\.", "cfm."), (r"^SAM\.", "sam."), (r"^sa\.conv1\.", "sa.conv."),
        (r"^out_SAM\.", "out_sam."), (r"^out_CFM\.", "out_cfm.")]),
    "sanet": ("bkbone.", []),
    "pvt_cascade": ("backbone.", [
        (r"^decoder\.Conv_1x1\.", "decoder.conv_1x1."),
        (r"^decoder\.ConvBlock(\d)\.conv\.", r"decoder.conv_block\1."),
        (r"^decoder\.Up(\d)\.up\.", r"decoder.up\1."),
        (r"^decoder\.AG(\d)\.W_g\.", r"decoder.ag\1.w_g."), (r"^decoder\.AG(\d)\.W_x\.", r"decoder.ag\1.w_x."),
        (r"^decoder\.AG(\d)\.psi\.", r"decoder.ag\1.psi."), (r"^decoder\.CA(\d)\.", r"decoder.ca\1."),
        (r"^decoder\.SA\.conv1\.", "decoder.sa.conv."),
        (r"^out_head(\d)\.", lambda m: f"heads.{int(m.group(1)) - 1}.")]),
    "g_cascade": ("backbone.", [
        (r"^decoder\.gcb(\d)\.0\.graph_conv\.gconv\.nn\.0\.", r"decoder.gcb\1.graph_conv.conv."),
        (r"^decoder\.gcb(\d)\.0\.graph_conv\.gconv\.nn\.1\.", r"decoder.gcb\1.graph_conv.norm."),
        (r"^decoder\.gcb(\d)\.0\.", r"decoder.gcb\1."), (r"^decoder\.ucb(\d)\.up\.", r"decoder.ucb\1."),
        (r"^decoder\.spa\.conv1\.", "decoder.spa.conv."),
        (r"^out_head(\d)\.", lambda m: f"heads.{int(m.group(1)) - 1}.")]),
}

#: official keys with no counterpart here, per architecture (regex): classifier heads and grey-input stems
DROPPED: dict[str, str] = {
    "pranet": r"^resnet\.fc\.", "polyp_pvt": r"^backbone\.head\.", "sanet": r"^bkbone\.fc\.",
    "pvt_cascade": r"^(conv\.|backbone\.head\.)", "g_cascade": r"^(conv_1cto3c\.|backbone\.head\.)",
}

RELEASED_ARCHS = tuple(RULES)
_REL_POS = re.compile(r"^decoder\.gcb(\d)\.0\.relative_pos$")


def _is_ours(sd: dict[str, torch.Tensor], model: "Segmentor") -> bool:
    """True when the file already uses our names (at least 90 % of its keys are our keys)."""
    own = model.state_dict().keys()
    return sum(k in own for k in sd) >= 0.9 * max(len(sd), 1)


def official_to_ours(arch: str, sd: dict[str, torch.Tensor], model: "Segmentor",
                     source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Rename an official state dict of ``arch`` to the parameter names of ``model`` (our adapter).

    Args:
        arch: one of :data:`RELEASED_ARCHS`.
        sd: the official ``model.state_dict()`` (``module.`` prefixes already stripped or not: stripped here).
        model: the adapter it is for (its PVTv2 backbone is needed by timm's filter; G-CASCADE's relative
            position shapes are checked against it).
        source: the file name, for error messages.

    Returns:
        A new dict with our names; the official keys listed in :data:`DROPPED` and G-CASCADE's ``relative_pos``
        terms are left out. Tensors are shared, not copied.

    Raises:
        MSBError: unknown ``arch``; a G-CASCADE ``relative_pos`` of another shape than ours (the file was trained
            at another ``img_size``).
    """
    if arch not in RULES:
        raise MSBError(f"model.checkpoint: released checkpoints are mapped for {', '.join(RELEASED_ARCHS)}, not "
                       f"'{arch}'; save that model's own state_dict() instead")
    sd = remove_prefixes(sd, ("module.",))
    if _is_ours(sd, model):
        return sd
    bb_prefix, rules = RULES[arch]
    drop = re.compile(DROPPED[arch])
    backbone, out = {}, {}
    buffers = dict(model.named_buffers())
    for k, v in sd.items():
        if drop.search(k):
            continue
        m = _REL_POS.match(k)
        if m:
            own = buffers.get(f"decoder.gcb{m.group(1)}.relative_pos")
            if own is not None and tuple(own.shape) not in (tuple(v.shape), tuple(v.squeeze(0).shape)):
                raise MSBError(f"{source}: {k} has shape {tuple(v.shape)}, ours {tuple(own.shape)}: the file was "
                               f"trained at another input size; set model.params.img_size (and data.input_size) "
                               f"to the size it was trained at")
            continue
        if k.startswith(bb_prefix):
            backbone[k[len(bb_prefix):]] = v
            continue
        for pat, rep in rules:
            k = re.sub(pat, rep, k)
        out[k] = v
    if arch in ("polyp_pvt", "pvt_cascade", "g_cascade"):
        from timm.models.pvt_v2 import checkpoint_filter_fn

        backbone = checkpoint_filter_fn(backbone, model.backbone.model)
    out.update({f"backbone.model.{k}": v for k, v in backbone.items()})
    return out


def load_released(model: "Segmentor", path: str | Path, arch: str) -> None:
    """Load the whole-model checkpoint ``path`` into ``model`` strictly: official names or ours for the
    architectures of :data:`RULES`, our names (``model.state_dict()``) for any other.

    Missing ``*.num_batches_tracked`` buffers (files written before PyTorch 0.4.1) are accepted and set to 0, as
    :meth:`torch.nn.Module.load_state_dict` does.

    Raises:
        MSBError: the file is missing or unreadable, or its keys do not match after renaming: one line naming
            the file and listing the missing, unexpected and mis-shaped keys (first 10 of each, with counts).
    """
    sd = read_state_dict(path, what="checkpoint")
    if arch in RULES:
        sd = official_to_ours(arch, sd, model, source=str(path))
    else:  # another architecture or a user model: our own names only
        sd = remove_prefixes(sd, ("module.",))
    check_and_load(model, sd, path)
