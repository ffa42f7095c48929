"""msb.profiling.tree_macs: MACs summed over the module tree by registered name (calflops' total), against hand
counts on small models and the conv+linear count where no module is shared."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from msb.config.schema import ModelConfig
from msb.models import build_model
from msb.profiling.flops import count_flops
from msb.profiling.tree_macs import call_macs, count_tree_macs


class _Shared(nn.Module):
    """conv (3->4, 3x3, pad 1) then linear (4->5) per pixel; the conv is also kept in a ModuleList, as the
    official HiFormer keeps ResNet stages both in ``resnet_layers`` and as ``p2``/``p3``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.keep = nn.ModuleList([self.conv])
        self.lin = nn.Linear(4, 5)

    def forward(self, x):
        return self.lin(self.conv(x).permute(0, 2, 3, 1))


def test_shared_module_counted_once_per_parent():
    x = torch.randn(2, 3, 6, 7)
    conv = 2 * 4 * 6 * 7 * 3 * 9  # out elements x C_in x k^2 = 9072
    lin = 2 * 6 * 7 * 5 * 4  # out elements x in_features = 1680
    res = count_tree_macs(_Shared(), x)
    assert res.run_macs == conv + lin
    assert res.macs == 2 * conv + lin  # reached from the root and from `keep`
    assert res.repeated_gmacs == conv / 1e9


def test_two_names_under_one_parent_count_once():
    """PyTorch's children() de-duplicates per parent, so an alias in the same parent adds nothing."""
    class _Alias(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 2)
            self.alias = self.lin

        def forward(self, x):
            return self.lin(x)

    assert count_tree_macs(_Alias(), torch.randn(4, 3)).macs == 4 * 2 * 3


def test_registrations_multiply_a_subtree_and_are_checked():
    m = _Shared()
    x = torch.randn(1, 3, 6, 7)
    conv, lin = 4 * 6 * 7 * 3 * 9, 6 * 7 * 5 * 4
    assert count_tree_macs(m, x, registrations={"lin": 3}).macs == 2 * conv + 3 * lin
    with pytest.raises(KeyError, match="nope"):
        count_tree_macs(m, x, registrations={"nope": 2})
    with pytest.raises(ValueError, match=">= 1"):
        count_tree_macs(m, x, registrations={"lin": 0})


def test_call_macs_of_a_transposed_conv():
    """ConvTranspose2d 6->4, k 2, stride 2 on 3x5: each of the 6·15 input elements meets 4·4 weights."""
    m = nn.ConvTranspose2d(6, 4, 2, stride=2)
    x = torch.randn(1, 6, 3, 5)
    assert call_macs(m, x, m(x)) == 6 * 15 * 4 * 4
    assert call_macs(nn.ReLU(), x, x) == 0


def test_unet_row_is_the_same_both_ways():
    """No shared module: the tree count is the conv+linear count; the classic U-Net gives Table 3's 48.18."""
    with torch.device("meta"):
        model = build_model(ModelConfig(arch="unet_classic"), 3)
    x = torch.empty(1, 3, 256, 256, device="meta")
    tree = count_tree_macs(model, x)
    assert tree.macs == tree.run_macs == count_flops(model, x).conv_linear_macs
    assert round(tree.macs / 1e9, 2) == 48.18


class _Products(nn.Module):
    """Each product spelling once, inside a child module registered twice (as a list entry and an attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _Spellings()
        self.keep = nn.ModuleList([self.inner])

    def forward(self, a, b):
        return self.inner(a, b)


class _Spellings(nn.Module):
    def forward(self, a, b):
        out = torch.matmul(a, b)  # counted: 2·3·4 x 5 = 120
        out = out + a.matmul(b)  # counted: 120
        out = out + a @ b  # the @ operator: not counted (as calflops)
        out = out + torch.bmm(a, b)  # not counted
        out = out + torch.einsum("bij,bjk->bik", a, b)  # not counted
        w = torch.ones(5, 5)
        out = out + torch.baddbmm(out, a, b)  # counted: 2·3·4·5 = 120
        return torch.nn.functional.linear(out, w)  # counted: out elements 2·3·5 x in 5 = 150


def test_functional_products_follow_calflops_scope_and_the_tree():
    """Hand counts: matmul, Tensor.matmul, baddbmm and F.linear called in a module's forward count (120 + 120 +
    120 + 150 = 510 MACs), ``@``, bmm and einsum do not; the module is reached twice from the root (its parent and
    the ModuleList), so the tree total is 2 x 510 while each call ran once."""
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    model = _Products()

    class _Root(nn.Module):  # count_tree_macs feeds one input; the two operands are fixed here
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, _):
            return self.m(a, b)

    res = count_tree_macs(_Root(), torch.zeros(1))
    assert res.run_macs == 510
    assert res.macs == 2 * 510
