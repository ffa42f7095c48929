"""Study state and manifest files (all written atomically).

Per dataset x architecture unit, in ``runs/<study>/_study/<dataset>-<arch>/``:

- ``spec.json``: the unit's study settings (search, cross-validation, base run-config hash) and their SHA-256
  (``spec_hash``); a rerun with other settings is refused instead of mixing results;
- ``selected.json``: the search result (selected parameters, run id and config hash of the fold runs);
- ``state.json``: progress (phase, finished/pending/failed work items), rewritten after every step;
- ``manifest.json``: binds the results to the spec hash, base and selected config hashes, ``folds.csv``
  SHA-256, every trial (number, parameters, state, value, run id), every fold run (config hash, split-file and
  checkpoint SHA-256s, counts files), the ensemble, the external datasets (index/classes SHA-256, class map),
  package versions and device.

``runs/<study>/_study/manifest.json`` lists the units with the SHA-256 of their manifests.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from msb.utils.atomic import atomic_write_text

__all__ = ["package_versions", "write_json", "read_json", "safe_url"]


def package_versions() -> dict[str, str]:
    """Python and the versions of the packages a study result depends on ("not installed" when absent)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for pkg in ("msb", "torch", "torchvision", "segmentation-models-pytorch", "timm", "numpy", "albumentations",
                "optuna", "scikit-learn", "sqlalchemy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def write_json(path: Path, data: dict[str, Any], stamp: bool = False) -> Path:
    """Write ``data`` as indented JSON atomically (``updated`` = UTC ISO time added when ``stamp``)."""
    if stamp:
        data = {**data, "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")
    return Path(path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when the file is absent."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def safe_url(url: str) -> str:
    """A storage URL without its password (``postgresql://user:***@host/db``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    cred, host = rest.rsplit("@", 1)
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"
