"""``msb models``: the architecture configs a study can name (``<configs root>/architectures/*.yaml``), with the
registry adapter each one selects, its encoder, input size and input-size rule, and (``--params``) its
parameter count.

The configs root is found as for a study in the working directory (``./configs``), or given with
``--configs``. Each config is merged onto ``global.yaml`` like a study's layers (``_base_`` resolved), so the
input size shown is the one a study without overrides would use (an architecture config may set its own,
e.g. SegFormer's 512 x 512; the dataset config comes later and may change it).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from msb.errors import MSBError

__all__ = ["architecture_catalog", "architecture_model_configs"]


def architecture_catalog(configs_root: Path, params: bool = False, num_classes: int = 3,
                         gmacs_at: tuple[int, ...] = ()) -> pd.DataFrame:
    """One row per architecture config.

    Args:
        configs_root: folder with ``global.yaml`` and ``architectures/``.
        params: also build each model (random init, ``num_classes`` output maps; 3 = the MSB paper's Table 3,
            NeoPolyp's background + 2 classes counted as 3 maps) and count its parameters (``sum(p.numel())``,
            in millions; slow for the PVT-based models).
        gmacs_at: with ``params``, square input sizes (px) at which to count GMACs per image under the named
            convention of :mod:`msb.profiling.flops` (convolutions + linear layers, attention products apart)
            and in calflops' counting (MSB Table 3's, :mod:`msb.profiling.tree_macs`); a size the model does not
            accept gives NaN. A model built for one input size (``params.img_size``) is rebuilt at each size.

    Returns:
        Columns ``config`` (the name a study's ``architectures:`` uses), ``adapter`` (registry name,
        ``model.arch``), ``encoder``, ``input_size`` (``HxW`` px), ``input_rule`` (multiples of the
        adapter's ``size_divisor``), and with ``params``: ``params_M``, and per ``gmacs_at`` size ``GMACs_<size>``,
        ``GMACs_calflops_<size>`` (and ``params_M_<size>`` for a model built for one input size).

    Raises:
        MSBError: no ``architectures/`` folder (names the folder and how to pick another).
    """
    from msb.models.registry import architecture_class

    rows = []
    for f, layer in _architecture_layers(configs_root):
        model = layer.get("model") or {}
        arch = str(model.get("arch", "?"))
        div = int(getattr(architecture_class(arch, f"{f}: key 'model.arch'"), "size_divisor", 1) or 1)
        size = (layer.get("data") or {}).get("input_size")
        row = {"config": f.stem, "adapter": arch, "encoder": str(model.get("encoder") or "-"),
               "input_size": f"{size[0]}x{size[1]}" if size else "from the dataset config",
               "input_rule": f"H, W multiples of {div} px" if div > 1 else "any H, W"}
        if params:
            net = _build(model, num_classes)
            row["params_M"] = round(sum(p.numel() for p in net.parameters()) / 1e6, 2)
            sized = isinstance((model.get("params") or {}).get("img_size"), (list, tuple))
            for size in gmacs_at:  # an adapter built for one input size (img_size) is rebuilt at each size
                at = _build({**model, "params": {**model["params"], "img_size": [int(size)] * 2}}, num_classes) \
                    if sized else net
                if sized:
                    row[f"params_M_{size}"] = round(sum(p.numel() for p in at.parameters()) / 1e6, 2)
                row[f"GMACs_{size}"], row[f"GMACs_calflops_{size}"] = _gmacs(at, int(size))
            del net
        rows.append(row)
    return pd.DataFrame(rows)


def _build(model_cfg: dict, num_classes: int):
    from msb.config.schema import ModelConfig
    from msb.models.registry import build_model

    return build_model(ModelConfig.model_validate(model_cfg), num_classes)


def _gmacs(net, size: int) -> tuple[float, float]:
    """GMACs of ``net`` on one (1, 3, size, size) input, rounded to 2 decimals: under
    :data:`msb.profiling.flops.CONVENTION` (``conv+linear``) and in calflops' counting
    (:func:`msb.profiling.tree_macs.count_tree_macs`, MSB Table 3's); NaNs when ``size`` is not a multiple of the
    model's ``size_divisor``. Counted on PyTorch's meta device (shapes only); ``net`` is moved there."""
    import torch

    from msb.profiling.flops import count_flops
    from msb.profiling.tree_macs import count_tree_macs

    div = int(getattr(net, "size_divisor", 1) or 1)
    if size % div:
        return float("nan"), float("nan")
    net.to("meta")
    x = torch.empty(1, 3, size, size, device="meta")
    return round(count_flops(net, x).gmacs, 2), round(count_tree_macs(net, x).gmacs, 2)


def _architecture_layers(configs_root: Path) -> list[tuple[Path, dict]]:
    """``(file, merged layer)`` of every ``configs_root/architectures/*.yaml`` on ``global.yaml`` (``_base_``
    resolved), sorted by name.

    Raises:
        MSBError: no ``architectures/`` folder (names the folder and how to pick another).
    """
    from msb.config.layering import deep_merge, load_layer

    folder = configs_root / "architectures"
    if not folder.is_dir():
        raise MSBError(f"{folder}: no architecture configs here; run from the project folder or pass --configs DIR")
    base = load_layer(configs_root / "global.yaml").data if (configs_root / "global.yaml").is_file() else {}
    return [(f, deep_merge(base, load_layer(f).data, str(f), {})) for f in sorted(folder.glob("*.yaml"))]


def architecture_model_configs(configs_root: Path) -> dict:
    """The ``model`` section of every architecture config, as a study without overrides resolves it.

    Args:
        configs_root: folder with ``global.yaml`` and ``architectures/``.

    Returns:
        ``{config name: msb.config.schema.ModelConfig}`` (e.g. ``unet_r18`` -> U-Net with a ResNet-18 encoder),
        sorted by name; empty when there is no ``architectures/`` folder.

    Raises:
        MSBError: a config whose ``model`` section is invalid (names the file and the key).
    """
    from msb.config.schema import ModelConfig

    if not (configs_root / "architectures").is_dir():
        return {}
    out = {}
    for f, layer in _architecture_layers(configs_root):
        try:
            out[f.stem] = ModelConfig.model_validate(layer.get("model") or {})
        except ValueError as e:
            raise MSBError(f"{f}: invalid 'model' section: {str(e).splitlines()[-1].strip()}") from None
    return out
