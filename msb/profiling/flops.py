"""Operation counts of one forward pass with PyTorch's own counter, ``torch.utils.flop_counter.FlopCounterMode``.

``FlopCounterMode`` intercepts the ATen operators that run and adds a formula-based FLOP count for the operators
in its registry (``torch.utils.flop_counter.flop_registry``): convolutions (incl. transposed and grouped),
``mm``/``addmm``/``bmm``/``baddbmm`` (``nn.Linear``, attention projections) and the fused attention kernels.
It counts one multiply-accumulate as **2 FLOPs** (for a convolution: ``2 * N * C_out * H_out * W_out *
C_in/groups * k_h * k_w``) and does **not** count the bias add. We report ``MACs = FLOPs / 2``.

Operators outside the registry contribute 0: batch/layer/group norm, activations (ReLU, GELU, sigmoid, ...),
pooling, interpolation (``upsample_*``), element-wise ``add``/``mul`` (residual connections, attention gates),
softmax. :func:`count_flops` records every operator that ran and lists the uncounted *arithmetic* ones, so each
result says what it leaves out (pure data-movement operators such as ``cat``, ``view`` or ``empty`` are not
listed: they do no arithmetic).

Attention: the CPU kernel of ``F.scaled_dot_product_attention`` (``_scaled_dot_product_flash_attention_for_cpu``)
is not in the registry, while the CUDA flash/efficient kernels are. :func:`count_flops` therefore runs the count
with the math backend (``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``), which decomposes attention into
counted ``bmm``s (``Q K^T`` and ``A V``: ``2 * B * heads * L_q * L_k * d`` FLOPs each); the count is then the same on
CPU and CUDA. Only the count uses the math backend; timing uses the default kernels.

**The named convention** (:data:`CONVENTION`, ``conv+linear``): the GMACs that ``msb profile`` and
``msb models --params --gmacs-at`` report are the MACs of the products with a learned weight, i.e. convolutions
(incl. transposed, grouped, 1-D) and linear layers (``aten.convolution``, ``mm``, ``addmm``). The products between
two activations, i.e. attention matrix products (``Q K^T`` and ``A V``: ``bmm``, ``baddbmm``, the SDPA kernels,
:data:`ATTENTION_OPS`), are counted apart (:attr:`FlopCount.attention_macs`, column ``gmacs_attention``) and not
included. This is the convention that reproduces Table 3 of the MedSegBenchmarker paper (section 4.1, "GMACs per
forward pass"): the classic U-Net (conv only) gives 48.18 GMACs at 256 px (192.70 at 512) as published, and
SegFormer-B3 gives 17.80 at 256 only without its 0.37 GMACs of attention products (18.17 with them; 17.89 with
ptflops' module hooks, which add norms and activations). ptflops' ATen backend counts conv + mm + addmm + bmm
plus conv biases, i.e. ``macs`` (all counted operators) plus one MAC per biased output element.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

__all__ = ["FlopCount", "count_flops", "DATA_MOVEMENT_OPS", "COUNTED_OPS", "ATTENTION_OPS", "CONVENTION",
           "CONVENTION_TEXT"]

#: name of the counting convention of the reported GMACs (see the module docstring)
CONVENTION = "conv+linear"
#: one line describing :data:`CONVENTION`, printed by ``msb profile`` and ``msb models --params``
CONVENTION_TEXT = ("GMACs (convention conv+linear) = multiply-accumulates of convolutions and linear layers per image "
                   "(torch FlopCounterMode FLOPs / 2); not included: attention matrix products (Q K^T, A V; "
                   "msb profile shows them apart), norms, activations, pooling, interpolation, element-wise ops, "
                   "bias adds (the convention that reproduces the MSB paper's Table 3 U-Net row)")

#: counted ATen operators (names without ``aten.``) that multiply two activations: attention ``Q K^T`` and
#: ``A V`` (explicit ``q @ k.transpose(-2, -1)`` lowers to ``bmm``; ``nn.MultiheadAttention`` to ``bmm`` or
#: ``baddbmm``; fused SDPA kernels when counted on CUDA). ``nn.Linear`` lowers to ``mm``/``addmm`` (under
#: ``no_grad`` a 3-D input is folded to 2-D), convolutions to ``convolution``.
ATTENTION_OPS: frozenset[str] = frozenset({
    "bmm", "baddbmm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "flex_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward", "_efficient_attention_backward",
    "flex_attention_backward",
})

#: ATen operators (overload packet names without the ``aten.`` prefix) that move, allocate or reinterpret
#: memory without arithmetic; they are left out of the "uncounted operators" list.
DATA_MOVEMENT_OPS: frozenset[str] = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "scalar_tensor",
    "view", "_unsafe_view", "reshape", "as_strided", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "flatten", "unflatten", "unbind", "split", "split_with_sizes", "chunk", "narrow",
    "cat", "stack", "clone", "copy_", "_to_copy", "contiguous", "detach", "alias", "lift_fresh", "index",
    "index_select", "gather", "constant_pad_nd", "pad", "repeat", "roll", "flip", "_reshape_alias",
    "arange", "linspace", "_local_scalar_dense", "set_", "resize_", "masked_fill", "masked_fill_",
})

#: Names of the operators FlopCounterMode counts (its registry), without the ``aten.`` prefix.
COUNTED_OPS: frozenset[str] = frozenset(str(k).split(".", 1)[-1] for k in flop_registry)


#: counted ATen operators that multiply an activation with a learned weight (convolutions, linear layers)
_WEIGHT_OPS: frozenset[str] = frozenset({"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
                                         "_slow_conv2d_forward", "convolution_backward", "mm", "addmm", "_scaled_mm"})


def _math_attention():
    """``sdpa_kernel(SDPBackend.MATH)`` where available (PyTorch >= 2.3), else a null context."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # pragma: no cover - old PyTorch
        return nullcontext()
    return sdpa_kernel([SDPBackend.MATH])


class _OpRecorder(TorchDispatchMode):
    """Dispatch mode that records the name of every ATen operator (overload packet) that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D401 (torch protocol)
        self.ops.add(str(func._overloadpacket).split(".", 1)[-1])
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class FlopCount:
    """FLOPs of one forward pass as counted by ``FlopCounterMode``.

    Attributes:
        flops: total FLOPs (int; 2 per multiply-accumulate, bias adds not counted).
        by_operator: FLOPs per counted operator name (e.g. ``{"convolution": ...}``).
        uncounted_ops: sorted names of arithmetic operators that ran but are not counted (0 FLOPs), e.g.
            ``("add_", "max_pool2d_with_indices", "native_batch_norm", "relu_", "upsample_nearest2d")``.
    """

    flops: int
    by_operator: dict[str, int] = field(default_factory=dict)
    uncounted_ops: tuple[str, ...] = ()

    @property
    def macs(self) -> int:
        """Multiply-accumulates of all counted operators: ``flops // 2`` (FlopCounterMode counts 2 FLOPs per MAC,
        so flops is even) = :attr:`conv_linear_macs` + :attr:`attention_macs`."""
        return self.flops // 2

    @property
    def attention_macs(self) -> int:
        """MACs of the products between two activations (operators in :data:`ATTENTION_OPS`: attention
        ``Q K^T`` and ``A V``)."""
        return sum(n for op, n in self.by_operator.items() if op in ATTENTION_OPS) // 2

    @property
    def conv_linear_macs(self) -> int:
        """MACs under the named convention :data:`CONVENTION`: convolutions and linear layers (all counted
        operators except :data:`ATTENTION_OPS`)."""
        return self.macs - self.attention_macs

    @property
    def gmacs(self) -> float:
        """GMACs under the named convention :data:`CONVENTION`: ``conv_linear_macs / 1e9`` (decimal giga)."""
        return self.conv_linear_macs / 1e9

    @property
    def gmacs_attention(self) -> float:
        """``attention_macs / 1e9``: the attention matrix products, not part of :attr:`gmacs`."""
        return self.attention_macs / 1e9


def count_flops(model: nn.Module, x: torch.Tensor) -> FlopCount:
    """Count the FLOPs of ``model(x)`` in eval mode without gradients.

    Args:
        model: any module; its forward may return a tensor or a list/tuple of tensors (all outputs, e.g.
            deep-supervision heads, are counted because they are computed).
        x: input batch, e.g. float32 (N, 3, H, W). Counts scale linearly with N; pass N = 1 for
            per-image counts.

    Returns:
        :class:`FlopCount`. Formulas: ``torch.utils.flop_counter`` (e.g. ``conv_flop_count``).
    """
    was_training = model.training
    model.eval()
    recorder = _OpRecorder()
    try:
        with torch.no_grad(), _math_attention(), FlopCounterMode(display=False) as counter, recorder:
            model(x)
    finally:
        model.train(was_training)
    by_op: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        by_op[str(op).split(".", 1)[-1]] = int(n)
    uncounted = sorted(op for op in recorder.ops if op not in COUNTED_OPS and op not in DATA_MOVEMENT_OPS)
    # every counted operator is either a weight product or an activation product: a new operator in a future
    # registry that is neither conv/mm/addmm nor in ATTENTION_OPS would silently join the convention
    unknown = set(by_op) - ATTENTION_OPS - _WEIGHT_OPS
    if unknown:
        raise RuntimeError(f"count_flops: counted operator(s) {sorted(unknown)} are not classified as conv/linear "
                           f"or attention; add them to ATTENTION_OPS or _WEIGHT_OPS in msb/profiling/flops.py")
    return FlopCount(int(counter.get_total_flops()), by_op, tuple(uncounted))

