"""Training-pool contrasts: the ``pools`` / ``seeds`` / ``contrasts`` keys of a study file, the ``data.pool``
and ``train.budget`` keys of a run config (docs/studies.md ``### pools``).

A study declares named training pools derived from its one dataset; :func:`pool_axes` turns them into study
axes (``data.pool`` x ``random_seed``), so every pool is trained with the same paired seed list through the
existing axes mechanism (:func:`msb.config.generate.axis_combinations`). The pool's rows are drawn at run start
from the dataset index and the run's training split (:mod:`msb.data.pools`); val/test never change.

Pool kinds (ReuScope-style matched controls):

``full``          every training row;
``remove``        the training rows minus those whose ``source`` is in ``sources``, whose ``group`` is in
                  ``groups`` or that are flagged in ``flag_file`` (an audit table, ``[FILE[:COLUMN]]``);
``random_match``  ``len(match)`` training rows drawn at random (``seed``) from every training row;
``count_match``   per stratum (``strata``: any of ``presence`` = foreground classes present, ``empty`` =
                  empty-mask frame, ``source``) as many rows as ``match`` has, drawn at random from the
                  training rows of that stratum;
``swap``          ``match`` (default ``full``) with its ``from_source`` rows replaced by as many training rows
                  of ``to_source`` that ``match`` does not hold;
``remove_neighbours``  the training rows minus the training neighbours of the evaluation frames that have a
                  close training match (``pairs_file``: an audit ``pairs.csv``, :mod:`msb.data.neighbours`);
``remove_distant`` the training rows minus as many *distant* training rows (in no pair with an evaluation
                  frame) as ``match`` (a ``remove_neighbours`` pool) removes, drawn at random (``seed``) per
                  stratum (``strata``, optional) so the removed rows match the neighbours' strata. The pair
                  ``remove_neighbours`` / ``remove_distant`` is ReuScope's local-versus-distant removal (step
                  four; :mod:`msb.analysis.stats.did`).

This module imports only pydantic (no training code).
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from msb.config.strict import StrictModel
from msb.errors import MSBError

__all__ = ["POOL_KINDS", "STRATA", "PoolConfig", "PoolSpec", "BudgetConfig", "ContrastsSpec", "DidSpec",
           "resolve_pools", "pool_axes"]

POOL_KINDS = ("full", "remove", "random_match", "count_match", "swap", "remove_neighbours", "remove_distant")
#: stratum keys of ``count_match`` (and of ``pool.csv``'s ``stratum`` column)
STRATA = ("presence", "empty", "source")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class _PoolFields(StrictModel):
    """The fields shared by a study pool (``match`` = a pool name) and a run's ``data.pool``."""

    name: str
    kind: Literal["full", "remove", "random_match", "count_match", "swap", "remove_neighbours", "remove_distant"]
    sources: list[str] = Field(default_factory=list)
    groups: list[str] = Field(default_factory=list)
    flag_file: Optional[str] = None
    strata: list[Literal["presence", "empty", "source"]] = Field(default_factory=list)
    from_source: Optional[str] = None
    to_source: Optional[str] = None
    pairs_file: Optional[str] = None
    seed: int = 0

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"pool name {v!r} must be letters, digits, '_', '-' or '.' (a folder-name part)")
        return v

    def _check_kind(self, match: Any) -> None:
        k = self.kind
        if k == "remove" and not (self.sources or self.groups or self.flag_file):
            raise ValueError(f"pool {self.name!r}: kind remove needs sources, groups or flag_file")
        if k != "remove" and (self.sources or self.groups or self.flag_file):
            raise ValueError(f"pool {self.name!r}: sources/groups/flag_file belong to kind remove, not {k}")
        if k == "remove_neighbours" and (not self.pairs_file or match is not None):
            raise ValueError(f"pool {self.name!r}: kind remove_neighbours needs pairs_file (an audit pairs.csv) and "
                             f"takes no 'match'")
        if k != "remove_neighbours" and self.pairs_file:
            raise ValueError(f"pool {self.name!r}: pairs_file belongs to kind remove_neighbours, not {k}")
        if k in ("random_match", "count_match", "remove_distant") and match is None:
            raise ValueError(f"pool {self.name!r}: kind {k} needs 'match' (the pool whose size/counts it copies)")
        if k == "full" and match is not None:
            raise ValueError(f"pool {self.name!r}: kind full takes no 'match'")
        if k == "count_match" and not self.strata:
            raise ValueError(f"pool {self.name!r}: kind count_match needs strata (presence, empty, source)")
        if k not in ("count_match", "remove_distant") and self.strata:
            raise ValueError(f"pool {self.name!r}: strata belong to kinds count_match and remove_distant, not {k}")
        if k == "swap" and (not self.from_source or not self.to_source or self.from_source == self.to_source):
            raise ValueError(f"pool {self.name!r}: kind swap needs two different from_source and to_source")
        if k != "swap" and (self.from_source or self.to_source):
            raise ValueError(f"pool {self.name!r}: from_source/to_source belong to kind swap, not {k}")


class PoolConfig(_PoolFields):
    """``data.pool`` of a run config: one pool with the definition of the pool it matches nested in ``match``
    (so the run config alone says how its rows are drawn, and the config hash covers it)."""

    match: Optional["PoolConfig"] = None

    @model_validator(mode="after")
    def _check(self) -> "PoolConfig":
        self._check_kind(self.match)
        return self


class PoolSpec(_PoolFields):
    """One entry of a study's ``pools`` list; ``match`` names another pool of the list."""

    match: Optional[str] = None

    @model_validator(mode="after")
    def _check(self) -> "PoolSpec":
        self._check_kind(self.match)
        return self


class BudgetConfig(StrictModel):
    """``train.budget``: train for ``value`` epochs or ``value`` optimizer steps (then the epoch count of each run
    is set from its training-pool size so that every pool makes exactly ``value`` steps; the last epoch stops
    early). Absent = ``train.epochs`` as always (the config hash is unchanged)."""

    unit: Literal["epochs", "steps"]
    value: int = Field(gt=0)


class DidSpec(StrictModel):
    """One local-versus-distant comparison (``contrasts.local_distant``; :mod:`msb.analysis.stats.did`).

    ``local`` = a ``remove_neighbours`` pool, ``distant`` = its ``remove_distant`` control; ``match_on`` (any of
    ``source``, ``empty``) and ``seed`` choose the matched unflagged evaluation images."""

    local: str
    distant: str
    match_on: list[Literal["source", "empty"]] = Field(default_factory=lambda: ["source", "empty"])
    seed: int = 0


class ContrastsSpec(StrictModel):
    """``contrasts`` of a study file: what ``msb contrasts`` tabulates.

    - ``pairs``: ``[pool_a, pool_b]`` pairs; each row is the mean over seeds of ``score(a) - score(b)``.
    - ``populations``: ``{name: spec}``, spec as :func:`msb.analysis.stats.populations.parse_population`
      (``all`` = every evaluated row; ``source:A,B``; ``ids:FILE``; ``flag:FILE[:COLUMN]``).
    - ``metric``, ``rule``: the score (``dice`` under ``image-macro`` by default).
    - ``n_boot``, ``level``, ``boot_seed``: the bootstrap over images (second interval row).
    - ``local_distant``: :class:`DidSpec` entries, the exploratory difference-in-differences of ReuScope's
      local-versus-distant removal (``local_distant.csv``).
    """

    pairs: list[tuple[str, str]] = Field(min_length=1)
    populations: dict[str, str] = Field(default_factory=lambda: {"all": "all"})
    metric: str = "dice"
    rule: str = "image-macro"
    checkpoint: str = "best"
    n_boot: int = Field(2000, gt=0)
    level: float = Field(0.95, gt=0, lt=1)
    boot_seed: int = 0
    local_distant: list[DidSpec] = Field(default_factory=list)


def resolve_pools(pools: list[PoolSpec], where: str) -> dict[str, PoolConfig]:
    """Each study pool as a :class:`PoolConfig` with its ``match`` chain nested (by name).

    Raises:
        MSBError: a pool name listed twice, a ``match`` naming no pool, or a cycle of ``match`` names (the study
            file and the pool are named).
    """
    by_name: dict[str, PoolSpec] = {}
    for p in pools:
        if p.name in by_name:
            raise MSBError(f"{where}: key 'pools': pool name {p.name!r} is listed twice; give each pool its own name")
        by_name[p.name] = p
    out: dict[str, PoolConfig] = {}

    def build(name: str, chain: tuple[str, ...]) -> PoolConfig:
        if name in chain:
            raise MSBError(f"{where}: key 'pools': 'match' names form a cycle ({' -> '.join((*chain, name))})")
        if name not in by_name:
            raise MSBError(f"{where}: key 'pools': pool {chain[-1]!r} matches {name!r}, which is not a pool of "
                           f"the list ({', '.join(by_name)})")
        p = by_name[name]
        data = p.model_dump(mode="json")
        data["match"] = build(p.match, (*chain, name)) if p.match else None
        return PoolConfig.model_validate(data)

    for name in by_name:
        out[name] = build(name, ())
    return out


def pool_axes(pools: list[PoolSpec], seeds: list[int], axes: dict[str, list[Any]], where: str
              ) -> dict[str, list[Any]]:
    """The study axes with the pools and seeds added: ``data.pool`` (each pool's JSON dump, in list order) and
    ``random_seed`` (``seeds``), after the study's own ``axes``.

    Raises:
        MSBError: pools without seeds (or seeds without pools), or ``axes`` that already vary ``data.pool`` or
            ``random_seed``.
    """
    if not pools and not seeds:
        return axes
    if not pools or not seeds:
        raise MSBError(f"{where}: keys 'pools' and 'seeds' go together (every pool is trained with every seed); "
                       f"give both")
    for key in ("data.pool", "random_seed"):
        if key in axes:
            raise MSBError(f"{where}: key 'axes.{key}' and 'pools'/'seeds' both set it; remove it from axes")
    resolved = resolve_pools(pools, where)
    out = dict(axes)
    out["data.pool"] = [resolved[p.name].model_dump(mode="json") for p in pools]
    out["random_seed"] = list(seeds)
    return out
