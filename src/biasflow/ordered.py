"""Options whose mapping order carries meaning (LPBS's group 1 vs group 2, LangFair's co-occurrence groups).

Plans, config hashes and Snakemake params sort every dict's keys (one text for one config), so an order that changes
the numbers may never travel as a dict: ``{male: [he], female: [she]}`` and ``{female: [she], male: [he]}`` would
hash alike and give opposite signs. At plan time such an option becomes a list of one-key mappings,
``[{male: [he]}, {female: [she]}]`` (users may write it that way too), and the code reads either form, in the
order given, with ``ordered_items``.
"""
from __future__ import annotations

from typing import Any, Mapping

from biasflow.errors import ConfigError


def is_ordered_list(spec: Any) -> bool:
    return isinstance(spec, list) and bool(spec) and all(isinstance(e, Mapping) and len(e) == 1 for e in spec)


def ordered_items(spec: Any, option: str) -> list[tuple[str, Any]]:
    """``(name, value)`` pairs of a mapping or of a list of one-key mappings, in the order written."""
    if isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    elif is_ordered_list(spec):
        items = [(str(k), v) for e in spec for k, v in e.items()]
    else:
        raise ConfigError(f"{option}: expected a mapping group -> words ({{a: [..], b: [..]}}) or a list of one-key "
                          f"mappings ([{{a: [..]}}, {{b: [..]}}]), got {spec!r}")
    names = [k for k, _ in items]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{option}: group {dup[0]!r} is given twice")
    return items


def as_ordered_list(spec: Any) -> Any:
    """A mapping as a list of one-key mappings (order kept); anything else unchanged."""
    if isinstance(spec, Mapping):
        return [{str(k): v} for k, v in spec.items()]
    return spec


__all__ = ["ordered_items", "as_ordered_list", "is_ordered_list"]
