"""HiFormer-B (Heidari, Kazerouni, Soltany, Azad, Aghdam, Cohen-Adad, Merhof; WACV 2023), from the paper and the
official code (amirhossein-kz/HiFormer: ``models/HiFormer.py``, ``models/Encoder.py``, ``models/Decoder.py``,
``utils.py``, ``configs/HiFormer_configs.py``: ``get_hiformer_b_configs``), as the MSB paper's HiFormer-B*.

- CNN: ResNet to ``layer3`` (timm ``resnet101`` by default = MSB's HiFormer-B*; ``cnn: resnet50`` = the official
  HiFormer-B; torchvision key names; ``layer4`` and ``fc`` are not built, as the official
  ``nn.ModuleList(resnet.children())[:7]``).
- Swin: the first three stages of Swin-T (timm ``SwinTransformerStage``, window 7, dims 96/192/384, depths
  2/2/6, heads 3/6/12, stochastic depth 0.1 over 10 blocks) without its patch embedding; the stages are fed by
  1×1 projections of the ResNet maps at strides 4, 8, 16, each added to the Swin output, with Swin-T's patch
  merging between them. Branch outputs: the stride-4 tokens (96 ch) and the stride-16 tokens (384 ch), each
  with a class token = the mean of its LayerNorm. Token grids that are not multiples of 7 (64/32/16 at 256²,
  128/64/32 at 512²) are padded to whole windows (timm); the official window partition needs multiples of 7
  (its 224² gives 56/28/14), so it cannot run at 256² or 512² unchanged.
- DLF ("double-level fusion"): learnt position embeddings of (1 + H/4·W/4, 96) and (1 + H/16·W/16, 384) (so the
  parameter count depends on the input size, as the MSB paper's Table 3 says), one multi-scale block of depth
  [1, 2, 0], heads (6, 12), MLP ratios (2, 2, 1): each branch's class token is projected to the other width,
  attends (cross-attention, query = class token) over the other branch's tokens and is projected back; then a
  LayerNorm per branch.
- Decoder: stride-4 branch → 3×3 conv 128 + GN(32) + ReLU; stride-16 branch → twice (3×3 conv 128 + GN + ReLU +
  bilinear ×2); sum; 1×1 conv to 16 + ReLU + bilinear ×4; 3×3 conv classifier at the input resolution.

MSB Table 3 (3 classes): HiFormer-B* 44.62 M parameters at 256², 46.09 M at 512², 25.52 / 100.03 GMACs. With
ResNet-101 this adapter has 44,618,573 / 46,093,133 parameters (``cnn: resnet50``: 25,626,445 / 27,101,005,
the official HiFormer-B). Its GMACs: 16.70 / 64.74 MACs run (``conv+linear``); the paper's figures count the
modules the official code registers under two names twice (calflops' module-tree sum, see
:mod:`msb.profiling.tree_macs`): ResNet ``layer2``/``layer3`` (``resnet_layers`` and ``p2``/``p3`` in
``models/Encoder.py``) and the decoder convolutions (``conv_tower`` and ``convs_level`` in ``models/Decoder.py``).
:attr:`HiFormer.official_registrations` declares them, and
:func:`~msb.profiling.tree_macs.count_tree_macs` then gives 25.52 / 100.03 (calflops 0.3.2 on the official code
with ResNet-101 and padded windows: 25.5208 / 100.0250).

As the official code (and counted in the paper's parameters and GMACs): the multi-scale block runs its
per-branch self-attention blocks (ViT blocks, 1 of width 96 and 2 of width 384) and then returns the fused
tokens without them, so those blocks cost time but never change the output (they get no gradient).

Built for one input size ``img_size`` (int or [H, W], multiples of 32; default 256); another size raises
:class:`~msb.errors.MSBError`. One output at the input resolution; test-time rule ``first``. Weights (official:
ImageNet Swin-T and ResNet-50): ``encoder_weights`` = a local Swin-T classification state dict (official or timm
names; its stages 1-3 load into ``backbone.swin_transformer``, its first two patch mergings into ``p1_pm``/
``p2_pm`` as the official code does; the patch embedding, stage 4, final norm and head are dropped), and
``params.cnn_weights`` = a local ResNet state dict of the chosen depth (torchvision/timm names, ``layer4``/``fc``
dropped), each loaded strictly.
"""

from __future__ import annotations

from typing import Sequence

import timm
import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.swin_transformer import PatchMerging, SwinTransformerStage
from timm.models.vision_transformer import Block
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["HiFormer"]


def _size(img_size: int | Sequence[int]) -> tuple[int, int]:
    size = (int(img_size), int(img_size)) if isinstance(img_size, int) else tuple(int(v) for v in img_size)
    if len(size) != 2 or min(size) <= 0 or any(v % 32 for v in size):
        raise MSBError(f"model.params.img_size: hiformer_b needs a positive size (int or [H, W]) with H and W "
                       f"multiples of 32, got {img_size!r}")
    return size  # type: ignore[return-value]


class _Pyramid(nn.Module):
    """ResNet (to layer3) + Swin-T stages 1-3: ``forward(x)`` -> [(B, 1+N/16, 96), (B, 1+N/256, 384)] with
    N = H·W, class token first."""

    def __init__(self, size: tuple[int, int], cnn: str = "resnet101") -> None:
        super().__init__()
        cnn = timm.create_model(cnn, pretrained=False, num_classes=0, zero_init_last=False)  # torchvision init
        del cnn.layer4
        self.resnet = cnn
        h, w = size[0] // 4, size[1] // 4
        dpr = [0.1 * i / 9 for i in range(10)]
        stages, start = [], 0
        for i, (dim, depth, heads) in enumerate(((96, 2, 3), (192, 2, 6), (384, 6, 12))):
            stages.append(SwinTransformerStage(dim, dim, (h >> i, w >> i), depth, downsample=False, num_heads=heads,
                                               window_size=7, drop_path=dpr[start:start + depth]))
            start += depth
        self.swin_transformer = nn.Module()
        self.swin_transformer.layers = nn.ModuleList(stages)
        self.p1_ch = nn.Conv2d(256, 96, 1)
        self.p1_pm = PatchMerging(96, 192)
        self.norm_1 = nn.LayerNorm(96)
        self.p2_ch = nn.Conv2d(512, 192, 1)
        self.p2_pm = PatchMerging(192, 384)
        self.p3_ch = nn.Conv2d(1024, 384, 1)
        self.norm_2 = nn.LayerNorm(384)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        r = self.resnet
        fm1 = r.layer1(r.maxpool(r.act1(r.bn1(r.conv1(x)))))
        fm2 = r.layer2(fm1)
        fm3 = r.layer3(fm2)
        swin = self.swin_transformer.layers
        nhwc = lambda t: t.permute(0, 2, 3, 1)  # noqa: E731
        s1 = nhwc(self.p1_ch(fm1))
        s1 = s1 + swin[0](s1)
        cls1 = self.norm_1(s1).mean((1, 2))[:, None]
        s2 = nhwc(self.p2_ch(fm2)) + swin[1](self.p1_pm(s1))
        s3 = nhwc(self.p3_ch(fm3)) + swin[2](self.p2_pm(s2))
        cls3 = self.norm_2(s3).mean((1, 2))[:, None]
        return [torch.cat([cls1, s1.flatten(1, 2)], 1), torch.cat([cls3, s3.flatten(1, 2)], 1)]


class _CrossAttention(nn.Module):
    """Class-token cross-attention: query = token 0, keys/values = all tokens -> (B, 1, C)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.wq, self.wk, self.wv = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        split = lambda t: t.reshape(b, t.shape[1], self.heads, c // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.wq(x[:, :1])), split(self.wk(x)), split(self.wv(x))
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, 1, c))


class _CrossBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _CrossAttention(dim, heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] + self.attn(self.norm1(x))


class _MultiScaleBlock(nn.Module):
    """The DLF block of depth [1, 2, 0] (official ``MultiScaleBlock``), dims (96, 384), heads (6, 12)."""

    def __init__(self, dims=(96, 384), depth=(1, 2), heads=(6, 12), mlp_ratio=(2.0, 2.0)) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(*[Block(d, h, r, qkv_bias=True) for _ in range(n)])
                                    for d, n, h, r in zip(dims, depth, heads, mlp_ratio))
        other = (dims[1], dims[0])
        self.projs = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.GELU(), nn.Linear(d, o))
                                   for d, o in zip(dims, other))
        self.fusion = nn.ModuleList(_CrossBlock(o, heads[1 - i]) for i, o in enumerate(other))
        self.revert_projs = nn.ModuleList(nn.Sequential(nn.LayerNorm(o), nn.GELU(), nn.Linear(o, d))
                                          for d, o in zip(dims, other))

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        outs = []
        for i in range(2):
            tmp = torch.cat([self.projs[i](xs[i][:, :1]), xs[1 - i][:, 1:]], 1)
            cls = self.revert_projs[i](self.fusion[i](tmp))
            outs.append(torch.cat([cls, xs[i][:, 1:]], 1))
        for x, blk in zip(outs, self.blocks):  # official: computed, then discarded (``outs_b`` is not returned)
            blk(x)
        return outs


def _conv_gn_relu(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.GroupNorm(32, cout), nn.ReLU()]


@register("hiformer_b")
class HiFormer(Segmentor):
    """HiFormer-B(*) as a :class:`Segmentor`: ``forward(x)`` (N, 3, H, W) with (H, W) = ``img_size`` ->
    ``[logits]``, logits (N, C, H, W). ``cnn``: ``resnet101`` (default, MSB's HiFormer-B*) or ``resnet50`` (the
    official HiFormer-B)."""

    test_time_rule = "first"
    size_divisor = 32
    #: submodules that the official code registers under two names (module docstring), for
    #: :func:`msb.profiling.tree_macs.count_tree_macs`; the model itself registers each once
    official_registrations = {"backbone.resnet.layer2": 2, "backbone.resnet.layer3": 2, "conv_up_l": 2, "conv_up_s": 2}

    def __init__(self, num_classes: int = 1, img_size: int | Sequence[int] = 256,
                 encoder_weights: str | None = None, cnn_weights: str | None = None, cnn: str = "resnet101") -> None:
        super().__init__()
        if cnn not in ("resnet50", "resnet101"):
            raise MSBError(f"model.params.cnn: hiformer_b takes resnet101 (MSB's HiFormer-B*, default) or resnet50 "
                           f"(the official HiFormer-B), got '{cnn}'")
        self.img_size = _size(img_size)
        h, w = self.img_size
        self.backbone = _Pyramid(self.img_size, cnn)
        n1, n2 = (h // 4) * (w // 4), (h // 16) * (w // 16)
        self.pos_embed = nn.ParameterList([nn.Parameter(torch.zeros(1, 1 + n1, 96)),
                                           nn.Parameter(torch.zeros(1, 1 + n2, 384))])
        self.fusion = _MultiScaleBlock()
        self.norm = nn.ModuleList([nn.LayerNorm(96), nn.LayerNorm(384)])
        self.conv_up_l = nn.Sequential(*_conv_gn_relu(96, 128))
        up = lambda: nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)  # noqa: E731
        self.conv_up_s = nn.Sequential(*_conv_gn_relu(384, 128), up(), *_conv_gn_relu(128, 128), up())
        self.conv_pred = nn.Sequential(nn.Conv2d(128, 16, 1), nn.ReLU(),
                                       nn.Upsample(scale_factor=4, mode="bilinear", align_corners=False))
        self.segmentation_head = nn.Conv2d(16, num_classes, 3, padding=1)
        for p in self.pos_embed:
            trunc_normal_(p, std=0.02)
        for m in [*self.fusion.modules(), *self.norm.modules()]:
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if not is_none(encoder_weights):
            self._load_swin(encoder_weights)
        if not is_none(cnn_weights):
            load_local_weights(self.backbone.resnet, cnn_weights, strip_prefixes=("module.",),
                               transform=lambda sd: {k: v for k, v in sd.items() if not k.startswith("layer4.")})

    def _load_swin(self, path: str) -> None:
        """Official Swin-T names: ``layers.{0,1,2}.blocks.*`` -> ``swin_transformer.layers.{i}.blocks.*``,
        ``layers.{0,1}.downsample.*`` -> ``p{1,2}_pm.*``; everything else (patch embedding, stage 4, the third
        merging, final norm, head, index/mask buffers) is dropped; the rest loads strictly."""
        def transform(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            out = {}
            for k, v in sd.items():
                parts = k.split(".", 3)
                if parts[0] != "layers" or k.endswith(("relative_position_index", "attn_mask")):
                    continue
                stage = int(parts[1])
                if parts[2] == "blocks" and stage < 3:
                    out[f"swin_transformer.layers.{stage}.blocks.{parts[3]}"] = v
                elif parts[2] == "downsample" and stage < 2:
                    out[f"p{stage + 1}_pm.{parts[3]}"] = v
            return out

        sub = nn.Module()
        sub.swin_transformer = self.backbone.swin_transformer
        sub.p1_pm, sub.p2_pm = self.backbone.p1_pm, self.backbone.p2_pm
        load_local_weights(sub, path, strip_prefixes=("module.",), transform=transform)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "HiFormer":
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        h, w = self.img_size
        if tuple(x.shape[-2:]) != (h, w):
            raise MSBError(f"hiformer_b was built for {h}x{w} inputs (model.params.img_size; its position "
                           f"embeddings depend on it) but got {x.shape[-2]}x{x.shape[-1]}")
        xs = [t + p for t, p in zip(self.backbone(x), self.pos_embed)]
        xs = [norm(t) for norm, t in zip(self.norm, self.fusion(xs))]
        b = x.shape[0]
        big = xs[0][:, 1:].transpose(1, 2).reshape(b, 96, h // 4, w // 4)
        small = xs[1][:, 1:].transpose(1, 2).reshape(b, 384, h // 16, w // 16)
        y = self.conv_pred(self.conv_up_l(big) + self.conv_up_s(small))
        return [self.segmentation_head(y)]
