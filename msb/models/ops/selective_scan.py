"""Selective scan of Mamba (Gu & Dao, 2023, "Mamba: linear-time sequence modeling with selective state spaces",
Algorithm 2 / eq. 2a-2b with the zero-order-hold discretisation of A and the Euler one of B), the core of VMamba's
SS2D and so of Swin-UMamba.

For channel d (of D = K·d_inner), state n (of N) and step t (of L)::

    Δ_t   = softplus(δ_t + b_δ)                       (when delta_softplus; else δ_t + b_δ)
    h_t   = exp(Δ_t · A[d, n]) · h_{t-1} + Δ_t · B[g(d), n, t] · u_t,   h_0 = 0
    y_t   = Σ_n C[g(d), n, t] · h_t[n] + D[d] · u_t      (× SiLU(z_t) when z is given)

with g(d) = d // (D / G) the group of channel d. :func:`selective_scan` uses the compiled CUDA kernel of the
``mamba_ssm`` package (``mamba_ssm.ops.selective_scan_interface.selective_scan_fn``) when that package is
installed and the input is on a CUDA device, else :func:`selective_scan_torch`, a pure-PyTorch version that runs
on any device (a step-by-step loop in inference; with autograd, chunks of up to 8 steps solved in closed form,
the state carried between chunks).
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

__all__ = ["selective_scan", "selective_scan_torch", "mamba_kernel_available"]


def mamba_kernel_available() -> bool:
    """True when the ``mamba_ssm`` package (with its compiled selective-scan kernel) is importable."""
    return importlib.util.find_spec("mamba_ssm") is not None


def _chunk_length(batch: int, dim: int, state: int, length: int, budget: int) -> int:
    """Steps per chunk: the chunked form keeps b·D·N·L·T values for the backward pass; T in 1..8 within
    ``budget`` values (T = 1 is the plain step-by-step recurrence)."""
    return max(1, min(8, budget // max(1, batch * dim * state * length)))


def selective_scan_torch(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                         D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                         delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                         chunk: int | None = None, budget: int = 1 << 27) -> torch.Tensor:
    """Pure-PyTorch selective scan (same arguments and result as ``mamba_ssm``'s ``selective_scan_fn``).

    The sequence is cut into chunks of T steps; inside a chunk the recurrence is solved in closed form,
    h_t = exp(S_t) h_0 + Σ_{s≤t} exp(S_t − S_s) Δ_s B_s u_s with S_t = Σ_{r≤t} Δ_r A (all exponents ≤ 0 for
    A < 0, Δ > 0, so no overflow), and the state is carried from chunk to chunk.

    Args:
        u: input (b, D, L) float.
        delta: step sizes (b, D, L) before ``delta_bias`` and softplus.
        A: state matrix (D, N), real (negative for a stable scan).
        B, C: input/output matrices (b, G, N, L) with G dividing D (or (b, N, L) = one group).
        D: skip weights (D,) or None; z: gate (b, D, L) or None; delta_bias: (D,) or None.
        chunk: steps per chunk T; None = the step-by-step loop when autograd is off (inference), else up to 8
            as long as b·D·N·L·T <= ``budget`` values (the memory the backward pass keeps).

    Returns:
        y (b, D, L), computed in float32, cast to u's dtype.
    """
    dtype = u.dtype
    u, delta, A = u.float(), delta.float(), A.float()
    if delta_bias is not None:
        delta = delta + delta_bias.float()[None, :, None]
    if delta_softplus:
        delta = F.softplus(delta)
    b, dim, length = u.shape
    if B.dim() == 3:
        B, C = B[:, None], C[:, None]
    groups, state = B.shape[1], A.shape[1]
    # (b, G, N, L) -> (b, D, L, N) by repeating each group over its D/G channels
    Bx = B.float().repeat_interleave(dim // groups, dim=1).transpose(2, 3)
    Cx = C.float().repeat_interleave(dim // groups, dim=1).transpose(2, 3)
    if chunk is None and not torch.is_grad_enabled():
        y = _scan_steps(u, delta, A, Bx, Cx)
    else:
        y = _scan_chunks(u, delta, A, Bx, Cx, chunk or _chunk_length(b, dim, state, length, budget))
    if D is not None:
        y = y + u * D.float()[None, :, None]
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(dtype)


def _scan_steps(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, Bx: torch.Tensor, Cx: torch.Tensor,
                block: int = 512) -> torch.Tensor:
    """Step-by-step recurrence (fewest operations; used without autograd): exp(Δ·A) and Δ·B·u are formed
    ``block`` steps at a time. u, delta (b, D, L); A (D, N); Bx, Cx (b, D, L, N) -> y (b, D, L)."""
    b, dim, length = u.shape
    h = u.new_zeros(b, dim, A.shape[1])
    ys = []
    for s in range(0, length, block):
        e = min(s + block, length)
        dt = delta[:, :, s:e]
        dA = torch.exp(dt.unsqueeze(-1) * A[None, :, None, :])
        dBu = (dt * u[:, :, s:e]).unsqueeze(-1) * Bx[:, :, s:e]
        c = Cx[:, :, s:e]
        for t in range(e - s):
            h = dA[:, :, t] * h + dBu[:, :, t]
            ys.append((h * c[:, :, t]).sum(-1))
    return torch.stack(ys, dim=-1)


def _scan_chunks(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, Bx: torch.Tensor, Cx: torch.Tensor,
                 T: int) -> torch.Tensor:
    """Chunks of T steps in closed form (fewer autograd nodes than the step loop). Shapes as :func:`_scan_steps`."""
    b, dim, length = u.shape
    h = u.new_zeros(b, dim, A.shape[1])
    ys = []
    for s in range(0, length, T):
        e = min(s + T, length)
        n = e - s
        dt = delta[:, :, s:e]                                                  # (b, D, n)
        cum = (dt.unsqueeze(-1) * A[None, :, None, :]).cumsum(2)              # S_t, (b, D, n, N)
        dbu = (dt * u[:, :, s:e]).unsqueeze(-1) * Bx[:, :, s:e]               # (b, D, n, N)
        if n == 1:
            hs = torch.exp(cum) * h[:, :, None] + dbu
        else:
            causal = torch.ones(n, n, dtype=torch.bool, device=u.device).tril()  # [t, s]: s <= t
            seg = (cum.unsqueeze(3) - cum.unsqueeze(2)).masked_fill(~causal[:, :, None], float("-inf"))
            hs = torch.einsum("bdtsn,bdsn->bdtn", torch.exp(seg), dbu) + torch.exp(cum) * h[:, :, None]
        ys.append((hs * Cx[:, :, s:e]).sum(-1))
        h = hs[:, :, -1]
    return torch.cat(ys, dim=-1)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                   delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                   use_kernel: bool | None = None) -> torch.Tensor:
    """The selective scan (shapes as :func:`selective_scan_torch`): the ``mamba_ssm`` CUDA kernel when
    ``use_kernel`` is True, or None (default) and the package is installed and ``u`` is on CUDA; else the
    pure-PyTorch version.

    Raises:
        RuntimeError: ``use_kernel=True`` without the ``mamba_ssm`` package.
    """
    if use_kernel is None:
        use_kernel = u.is_cuda and mamba_kernel_available()
    if use_kernel:
        if not mamba_kernel_available():
            raise RuntimeError("selective_scan(use_kernel=True) needs the mamba_ssm package (pip install mamba-ssm)")
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

        return selective_scan_fn(u, delta, A, B.contiguous(), C.contiguous(), D, z=z, delta_bias=delta_bias,
                                 delta_softplus=delta_softplus, return_last_state=False)
    return selective_scan_torch(u, delta, A, B, C, D, z, delta_bias, delta_softplus)
