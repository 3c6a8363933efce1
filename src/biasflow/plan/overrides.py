"""Command-line overrides: split into Hydra's parsed overrides, and a sweep (``-m``) expanded into one override list
per job, with Hydra's own parser."""
from __future__ import annotations

import itertools
from typing import Any, Sequence

from biasflow.errors import ConfigError

# Hydra's override parser takes time quadratic in a list's length (each element is looked up among all the
# list's children): a 100 kB list took 71 s, parsed three times. Each override is parsed once per process, and a
# long list value in chunks of LIST_CHUNK elements, each parsed by Hydra as it would parse the whole.
_PARSED: dict[str, Any] = {}
LIST_CHUNK = 256


def _top_level_elements(value: str) -> list[str] | None:
    """The elements of a list literal ``[a, 'b,c', {x: 1}, ${y}]`` as written, split at its top-level commas; None
    when the text is not one balanced list."""
    if not (value.startswith("[") and value.endswith("]")):
        return None
    inner, parts, depth, quote, start, i = value[1:-1], [], 0, None, 0, 0
    while i < len(inner):
        c = inner[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
        i += 1
    if quote or depth:
        return None
    parts.append(inner[start:])
    return parts


def parse_overrides(overrides: Sequence[str]) -> list[Any]:
    """Hydra's parse of each override (``Override`` objects), as ``OverridesParser.parse_overrides`` gives it."""
    import copy

    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = None
    out = []
    for line in overrides:
        if line not in _PARSED:
            parser = parser or OverridesParser.create()
            key, sep, value = line.partition("=")
            elements = _top_level_elements(value) if sep and len(value) > 4096 else None
            if elements is None or len(elements) <= LIST_CHUNK:
                _PARSED[line] = parser.parse_overrides([line])[0]
            else:
                values: list[Any] = []
                for i in range(0, len(elements), LIST_CHUNK):
                    values += parser.parse_overrides([f"{key}=[{','.join(elements[i:i + LIST_CHUNK])}]"])[0]._value
                whole = parser.parse_overrides([f"{key}=[]"])[0]
                whole._value, whole.input_line = values, line
                _PARSED[line] = whole
        out.append(copy.deepcopy(_PARSED[line]))
    return out


def expand_sweep(overrides: Sequence[str], multirun: bool) -> list[list[str]]:
    """One override list per job: the cartesian product of every swept key (Hydra's basic sweeper semantics)."""
    from hydra.errors import HydraException

    try:
        parsed = parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(f"could not parse overrides {list(overrides)}: {exc}") from exc
    choices = []
    for o in parsed:
        if o.is_sweep_override():
            if not multirun:
                raise ConfigError(f"override {o.input_line!r} is a sweep: add -m (multirun) to sweep it")
            o.config_loader = _GroupOptions()  # glob(...) lists a config group's files, as Hydra's sweeper does
            values = list(o.sweep_string_iterator())
            if not values:
                raise ConfigError(f"{o.input_line}: matches no config in conf/{o.key_or_group}/")
            choices.append([f"{o.get_key_element()}={v}" for v in values])
        else:
            choices.append([o.input_line])
    return [list(c) for c in itertools.product(*choices)] if choices else [[]]


class _GroupOptions:
    """What Hydra's ``glob(...)`` sweep asks of a config loader: the config names of a group (``model=glob(ckpt_*)``
    sweeps every ``conf/model/ckpt_*.yaml``, the user's conf folder included)."""

    def get_group_options(self, group: str, results_filter=None) -> list[str]:
        from biasflow.plan.conf import conf_dir

        return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
