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


def architecture_catalog(configs_root: Path, params: bool = False) -> pd.DataFrame:
    """One row per architecture config.

    Args:
        configs_root: folder with ``global.yaml`` and ``architectures/``.
        params: also build each model (random init, 1 foreground class) and count its parameters
            (``sum(p.numel())``, in millions; slow for the PVT-based models).

    Returns:
        Columns ``config`` (the name a study's ``architectures:`` uses), ``adapter`` (registry name,
        ``model.arch``), ``encoder``, ``input_size`` (``HxW`` px), ``input_rule`` (multiples of the
        adapter's ``size_divisor``), and ``params_M`` with ``params``.

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
            row["params_M"] = round(_n_params(model) / 1e6, 2)
        rows.append(row)
    return pd.DataFrame(rows)


def _n_params(model_cfg: dict) -> int:
    from msb.config.schema import ModelConfig
    from msb.models.registry import build_model

    cfg = ModelConfig.model_validate(model_cfg)
    net = build_model(cfg, 1)
    return int(sum(p.numel() for p in net.parameters()))


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
