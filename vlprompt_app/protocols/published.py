"""Published numbers of each method (``configs/published/<protocol>.yaml``), for "ours vs paper".

File format (one file per protocol)::

    protocol: base2new            # or cross_dataset, dg, fft, ttt
    methods:
      CoOp:                       # a trainer name, or TRAINER:CFG for one config only
        source: "MaPLe paper, Table 1"
        values:
          imagenet: [76.47, 67.88, 71.92]   # base2new: [Base, Novel, HM]
          average: [82.69, 63.22, 71.66]    # the paper's Average row
      DeAR:
        source: "DeAR paper, Table 3"
        values: {imagenet: 71.50, caltech101: 95.00, average: 67.60}   # cross_dataset/dg/fft/ttt

Rows are dataset YAML stems plus ``average``; a method may give only some of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

import yaml

__all__ = ["PUBLISHED_PROTOCOLS", "PublishedError", "Published", "load_published", "published_path",
           "find_published"]

PUBLISHED_PROTOCOLS = ("base2new", "cross_dataset", "dg", "fft", "ttt")
BASE2NEW_COLUMNS = ("Base", "Novel", "HM")


class PublishedError(ValueError):
    """A published-numbers file that is missing or malformed."""


@dataclass(frozen=True)
class Published:
    """One method's published numbers.

    Attributes:
        source: where they come from.
        values: row (dataset stem or "average") -> column name -> value; base2new columns
            are Base, Novel, HM, cross_dataset/dg/fft/ttt rows have the single column "".
    """

    source: str
    values: Dict[str, Dict[str, float]]

    def get(self, row: str, column: str = "") -> Optional[float]:
        return self.values.get(row, {}).get(column)


def published_path(protocol: str, configs_dir) -> Path:
    return Path(configs_dir, "published", f"{protocol}.yaml")


def _number(path: Path, where: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PublishedError(f"Published numbers '{path}': {where} must be a number, got {value!r}.")
    return float(value)


def _values(path: Path, protocol: str, method: str, values) -> Dict[str, Dict[str, float]]:
    if not isinstance(values, dict) or not values:
        raise PublishedError(f"Published numbers '{path}': methods.{method}.values must map "
                             f"datasets to numbers, got {values!r}.")
    parsed = {}
    for row, value in values.items():
        where = f"methods.{method}.values.{row}"
        if protocol == "base2new":
            if not isinstance(value, list) or len(value) != 3:
                raise PublishedError(f"Published numbers '{path}': {where} must be "
                                     f"[Base, Novel, HM], got {value!r}.")
            parsed[row] = {c: _number(path, where, v) for c, v in zip(BASE2NEW_COLUMNS, value)}
        else:
            parsed[row] = {"": _number(path, where, value)}
    return parsed


def load_published(path: Union[str, Path], protocol: str) -> Dict[str, Published]:
    """Method key (``TRAINER`` or ``TRAINER:CFG``) -> Published, validated.

    Raises:
        PublishedError: missing file, wrong protocol, malformed entries (one clear message).
    """
    path = Path(path)
    if protocol not in PUBLISHED_PROTOCOLS:
        raise PublishedError(f"There are no published-number files for the protocol {protocol} "
                             f"(only {', '.join(PUBLISHED_PROTOCOLS)}).")
    if not path.is_file():
        raise PublishedError(f"Published numbers '{path}' do not exist.")
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PublishedError(f"Published numbers '{path}': not valid YAML ({exc}).") from None
    if not isinstance(content, dict) or content.get("protocol") != protocol:
        found = content.get("protocol") if isinstance(content, dict) else None
        raise PublishedError(f"Published numbers '{path}' are for the protocol {found!r}, "
                             f"not {protocol!r} (expected a mapping with 'protocol: {protocol}').")
    methods = content.get("methods")
    if not isinstance(methods, dict) or not methods:
        raise PublishedError(f"Published numbers '{path}': 'methods' must map method names to "
                             "{source, values}.")
    published = {}
    for method, entry in methods.items():
        if not isinstance(entry, dict) or set(entry) != {"source", "values"}:
            raise PublishedError(f"Published numbers '{path}': methods.{method} must have exactly "
                                 f"the keys source and values, got {entry!r}.")
        published[str(method)] = Published(str(entry["source"]),
                                           _values(path, protocol, method, entry["values"]))
    return published


def find_published(published: Dict[str, Published], trainer: str,
                   cfgs: Tuple[str, ...]) -> Optional[Published]:
    """The entry for ``TRAINER:CFG`` (when the method has one config), else for ``TRAINER``."""
    if len(cfgs) == 1 and f"{trainer}:{cfgs[0]}" in published:
        return published[f"{trainer}:{cfgs[0]}"]
    return published.get(trainer)
