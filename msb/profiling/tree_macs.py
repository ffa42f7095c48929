"""Multiply-accumulates summed over the module tree by registered name: the counting of ``calflops`` (and of
DeepSpeed's flops profiler, from which it derives), which the MSB paper's HiFormer-B* GMACs follow.

Such a profiler attributes the MACs of each convolution / linear call to the module that made it, then totals
``module.__macs__`` recursively over ``module.children()`` (calflops 0.3.2, ``utils.get_module_macs``). A
submodule that runs once but is registered under two parents (for instance kept both in a ``ModuleList`` and as
an attribute) is reached twice by that walk and so counted twice. For a model without such sharing the total is
the MACs that run, i.e. :data:`msb.profiling.flops.CONVENTION` (``conv+linear``): the classic U-Net gives 48.18
GMACs at 256² both ways, as MSB's Table 3 prints.

The official HiFormer code (amirhossein-kz/HiFormer) registers modules twice: ``models/Encoder.py``
``PyramidFeatures`` keeps ResNet ``layer2``/``layer3`` in ``resnet_layers`` (``nn.ModuleList(resnet.children())
[:7]``) and again as ``p2``/``p3``; ``models/Decoder.py`` ``ConvUpsample`` keeps its convolutions in
``conv_tower`` (a ``ModuleList``) and again in ``convs_level`` (an ``nn.Sequential`` of the same modules). MSB
Table 3's HiFormer-B* (25.52 / 100.03 GMACs at 256² / 512²) is that code with a ResNet-101, counted this way:
calflops 0.3.2 on it gives 25.5208 / 100.0250 GMACs, of which 8.8206 / 35.2825 are the twice-registered ResNet
stages and decoder convolutions counted a second time; the MACs that run are 16.7001 / 64.7426 (``conv+linear``).

Our adapters do not duplicate modules; one whose official code does declares it in an ``official_registrations``
attribute (``{submodule path: number of names it has in the official code}``), which :func:`count_tree_macs`
applies, so the paper's figure is reproduced without changing the model or its state dict.

Scope: the MACs of ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d`` and ``nn.Linear`` calls (no bias, norm,
activation or attention product). calflops' MACs also include ``torch.matmul``/``Tensor.matmul``/``addmm``/
``baddbmm`` and functional ``F.linear``/``F.conv*`` calls made outside such modules (not the ``@`` operator,
``torch.bmm``, ``F.scaled_dot_product_attention``, and ``einsum`` with 0 MACs); those are not reproduced here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["TreeMacs", "count_tree_macs", "TREE_CONVENTION", "call_macs"]

#: name of the counting convention of :func:`count_tree_macs`
TREE_CONVENTION = "conv+linear by registered name (calflops)"

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def call_macs(module: nn.Module, inp: torch.Tensor, out: torch.Tensor) -> int:
    """MACs of one call of a convolution or linear module (0 for any other module).

    Args:
        module: the module that ran.
        inp: its first input (any dtype/device, ``meta`` included: only shapes are read).
        out: its output.

    Returns:
        Conv: ``out.numel() * C_in / groups * prod(kernel)``; transposed conv: ``inp.numel() * C_out / groups *
        prod(kernel)`` (each input element meets C_out/groups·k kernel weights); Linear: ``out.numel() *
        in_features``. Bias adds are not counted (as ``torch.utils.flop_counter`` and calflops' MACs).
    """
    if isinstance(module, _CONV_T):
        return inp.numel() * (module.out_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, _CONV):
        return out.numel() * (module.in_channels // module.groups) * math.prod(module.kernel_size)
    if isinstance(module, nn.Linear):
        return out.numel() * module.in_features
    return 0


@dataclass(frozen=True)
class TreeMacs:
    """Result of :func:`count_tree_macs`.

    Attributes:
        macs: MACs summed over the module tree by registered name (int).
        run_macs: MACs of the conv/linear calls that ran, each once (int; = ``conv+linear`` for models whose
            convolutions and linear layers are all modules).
        registrations: the ``{submodule path: number of names}`` that was applied.
    """

    macs: int
    run_macs: int
    registrations: dict

    @property
    def gmacs(self) -> float:
        """``macs / 1e9`` (decimal giga)."""
        return self.macs / 1e9

    @property
    def repeated_gmacs(self) -> float:
        """``(macs - run_macs) / 1e9``: the part counted more than once."""
        return (self.macs - self.run_macs) / 1e9


def count_tree_macs(model: nn.Module, x: torch.Tensor, registrations: Mapping[str, int] | None = None) -> TreeMacs:
    """Conv/linear MACs of ``model(x)`` summed over ``children()`` from the root, as calflops totals them.

    Args:
        model: any module (run in eval mode without gradients; its training flag is restored).
        x: one input batch, e.g. (1, 3, H, W); ``meta`` tensors work (shapes only).
        registrations: ``{dotted submodule path: n}``: count that subtree ``n`` times, for a submodule the
            reference implementation registers under ``n`` names. Default: ``model.official_registrations``
            when the model has it, else none.

    Returns:
        :class:`TreeMacs`. A module registered under k different parents in ``model`` itself is counted k
        times (``children()`` of each parent yields it); under two names of one parent once (PyTorch's
        ``named_children`` de-duplicates per parent).

    Raises:
        KeyError: a path in ``registrations`` that is not a submodule of ``model``.
        ValueError: a count below 1.
    """
    regs = dict(getattr(model, "official_registrations", {}) if registrations is None else registrations)
    for path, n in regs.items():
        try:
            model.get_submodule(path)
        except AttributeError as err:
            raise KeyError(f"count_tree_macs: registrations names {path!r}, not a submodule of the model") from err
        if int(n) < 1:
            raise ValueError(f"count_tree_macs: registrations[{path!r}] = {n}; a count must be >= 1")
    own: dict[int, int] = {}

    def hook(mod, args, out):
        if args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            own[id(mod)] = own.get(id(mod), 0) + call_macs(mod, args[0], out)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (*_CONV, *_CONV_T, nn.Linear))]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()

    def walk(mod: nn.Module, path: str) -> int:
        total = own.get(id(mod), 0)
        for name, child in mod.named_children():
            sub = f"{path}.{name}" if path else name
            total += int(regs.get(sub, 1)) * walk(child, sub)
        return total

    return TreeMacs(macs=walk(model, ""), run_macs=sum(own.values()), registrations=regs)
