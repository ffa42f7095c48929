"""Schema of the optional ``cluster`` section: the Slurm resources of ``msb submit`` (docs/studies.md, "On a
Slurm cluster").

Set in ``configs/global.yaml``, in a study's ``overrides`` or as a top-level ``cluster:`` key of the study file
(later wins, merged key by key), and per submission with ``msb submit --slurm KEY=VALUE``. Like
``notifications``, the section is **excluded from the run config's dump and hash** (``RunConfig.cluster`` has
``exclude=True``): where a run is trained does not change what it computes.
"""

from __future__ import annotations

import re
from typing import Optional

from pydantic import Field, field_validator

from msb.config.strict import StrictModel

__all__ = ["ClusterConfig", "SLURM_TIME"]

#: Slurm's time formats (``sbatch --time``): ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")


class ClusterConfig(StrictModel):
    """Resources of each worker of ``msb submit`` (one Slurm array task = one ``msb run --worker`` process).

    ``partition``, ``account``, ``qos``: ``sbatch --partition/--account/--qos`` (cluster default when unset).
    ``time``: wall-clock limit per worker in a Slurm format (``90``, ``12:00:00``, ``2-00:00:00``).
    ``cpus_per_task``: CPU cores per worker (also ``OMP_NUM_THREADS``); ``gpus_per_task``: GPUs per worker
    (0: none). ``mem``: memory per node, a number with an optional unit ``K``, ``M``, ``G``, ``T`` (``32G``).
    ``sbatch``: extra ``#SBATCH`` lines, one long option each (``--constraint=a100``).
    ``setup``: shell lines run before ``msb`` on the compute node (``module load cuda``,
    ``source /shared/venv/bin/activate``). ``python``: the interpreter that runs ``python -m msb`` there
    (default: the one running ``msb submit``, which suits a shared file system).
    ``heartbeat_interval``, ``grace_period``: seconds, passed to ``msb run --worker`` (docs/studies.md).
    """

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time: Optional[str] = None
    cpus_per_task: int = Field(1, ge=1)
    gpus_per_task: int = Field(0, ge=0)
    mem: Optional[str] = None
    sbatch: list[str] = Field(default_factory=list)
    setup: Optional[str] = None
    python: Optional[str] = None
    heartbeat_interval: int = Field(30, ge=1)
    grace_period: int = Field(120, ge=1)

    @field_validator("time")
    @classmethod
    def _time(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not SLURM_TIME.match(str(v)):
            raise ValueError(f"'{v}' is not a Slurm time (minutes, HH:MM:SS, D-HH:MM:SS, ...)")
        return v

    @field_validator("mem")
    @classmethod
    def _mem(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^\d+[KMGT]?$", str(v)):
            raise ValueError(f"'{v}' is not a Slurm memory size (e.g. 16000, 32G)")
        return v

    @field_validator("partition", "account", "qos")
    @classmethod
    def _word(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not re.match(r"^[A-Za-z0-9_.,-]+$", v):
            raise ValueError(f"'{v}' is not a Slurm name (letters, digits, _ . , -)")
        return v

    @field_validator("sbatch")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        for line in v:
            if not line.startswith("--") or "\n" in line:
                raise ValueError(f"'{line}': each sbatch line is one long option such as --constraint=a100")
        return v
