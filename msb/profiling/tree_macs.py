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

Scope, as calflops 0.3.2 patches ``torch`` (``pytorch_ops.py``): every call of ``F.linear``, ``F.conv1d/2d/3d``,
``F.conv_transpose1d/2d/3d`` (so every ``nn.Linear`` / ``nn.Conv*`` module), ``torch.matmul`` / ``Tensor.matmul``,
``torch.addmm`` and ``torch.baddbmm``, each attributed to the innermost module running; not the ``@`` operator,
``torch.bmm``, ``einsum`` or ``F.scaled_dot_product_attention`` (0 MACs there), no bias, norm or activation. So an
attention written with ``torch.matmul`` counts and one written with ``@`` does not: the code's spelling decides, as
it did for the paper (our adapters spell each product as the official code does). With this scope the count gives
every row of MSB Table 3 at 256² and 512² (tests/models/test_table3_calflops.py); for a model without registered
duplicates and without those product calls it equals :data:`msb.profiling.flops.CONVENTION`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["TreeMacs", "count_tree_macs", "TREE_CONVENTION", "call_macs"]

#: name of the counting convention of :func:`count_tree_macs`
TREE_CONVENTION = ("calflops (MSB Table 3): conv / linear / torch.matmul / addmm / baddbmm calls, summed over the module "
                   "tree by registered name")

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def _conv_macs(out, inp, weight, *args, **kwargs) -> int:
    """``F.conv*``: output elements x ``C_in / groups`` x kernel size (``weight`` is ``(C_out, C_in/g, *k)``)."""
    return out.numel() * math.prod(weight.shape[1:])


def _conv_t_macs(out, inp, weight, *args, **kwargs) -> int:
    """``F.conv_transpose*``: input elements x ``C_out / groups`` x kernel size (``weight`` ``(C_in, C_out/g, *k)``)."""
    return inp.numel() * math.prod(weight.shape[1:])


def _linear_macs(out, inp, weight, *args, **kwargs) -> int:
    """``F.linear``: output elements x ``in_features``."""
    return out.numel() * weight.shape[-1]


def _matmul_macs(out, a, b, *args, **kwargs) -> int:
    """``torch.matmul`` / ``Tensor.matmul`` as calflops counts it: ``prod(a.shape) * b.shape[-1]``."""
    return math.prod(a.shape) * b.shape[-1]


def _addmm_macs(out, bias, a, b, *args, **kwargs) -> int:
    """``torch.addmm`` (calflops): ``prod(mat1.shape) * mat2.shape[-1]``."""
    return math.prod(a.shape) * b.shape[-1]


def _baddbmm_macs(out, bias, a, b, *args, **kwargs) -> int:
    """``torch.baddbmm`` (calflops): ``B * n * m * p``."""
    return a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


#: the calls counted, as calflops 0.3.2 patches them (``pytorch_ops.py``): (owner, attribute, MACs formula).
#: Not counted (as calflops): the ``@`` operator, ``torch.bmm``, ``einsum``, ``F.scaled_dot_product_attention``.
_FUNCTIONAL = (
    (F, "linear", _linear_macs), (F, "conv1d", _conv_macs), (F, "conv2d", _conv_macs), (F, "conv3d", _conv_macs),
    (F, "conv_transpose1d", _conv_t_macs), (F, "conv_transpose2d", _conv_t_macs),
    (F, "conv_transpose3d", _conv_t_macs), (torch, "matmul", _matmul_macs), (torch.Tensor, "matmul", _matmul_macs),
    (torch, "addmm", _addmm_macs), (torch, "baddbmm", _baddbmm_macs),
)


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
        run_macs: MACs of the counted calls that ran, each once (int; = ``conv+linear`` for a model without
            ``torch.matmul`` / ``addmm`` / ``baddbmm`` calls).
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
    """MACs of ``model(x)`` in calflops' scope (``F.linear``, ``F.conv*``, ``torch.matmul``, ``Tensor.matmul``,
    ``addmm``, ``baddbmm`` calls; module docstring) summed over ``children()`` from the root, as calflops totals them.

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
    stack: list[nn.Module] = [model]

    def push(mod, args):
        stack.append(mod)

    def pop(mod, args, out):
        if stack[-1] is mod:
            stack.pop()

    def counted(fn, macs_of):
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            here = stack[-1]
            own[id(here)] = own.get(id(here), 0) + int(macs_of(out, *args, **kwargs))
            return out
        return wrapper

    handles = [h for m in model.modules()
               for h in (m.register_forward_pre_hook(push), m.register_forward_hook(pop, always_call=True))]
    patched = [(owner, name, getattr(owner, name)) for owner, name, _ in _FUNCTIONAL]
    for (owner, name, macs_of), (_, _, fn) in zip(_FUNCTIONAL, patched):
        setattr(owner, name, counted(fn, macs_of))
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for owner, name, fn in patched:
            setattr(owner, name, fn)
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
