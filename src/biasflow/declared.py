"""The one registry mechanism: name -> declaration, filled by the modules that declare them.

Metrics and dataset loaders (``biasflow.registry``), model kinds (``biasflow.model_kinds``) and generator kinds
(``biasflow.generator_kinds``) are each a ``Registry``: reading one imports, once, every module of its packages and
the modules an installed package names under its entry-point group (so a package of one's own adds a metric, a
loader or a model kind without editing biasflow); each module registers what it declares. Registering writes without
reading, so a module can register while the modules are imported; a second declaration under a taken name from
another module is an error naming both. This module imports no other biasflow module.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterable


class Registry(dict):
    """name -> declaration, for one kind of declaration (``what``: "metric", "model kind", ...).

    ``packages``: every module of each is imported on the first read (names starting with ``_`` left out).
    ``entry_point_group``: installed packages name their declaring modules under it (their pyproject.toml:
    ``[project.entry-points."<group>"] mine = "my_project.module"``). ``after_load``: called once every module is
    imported (checks of references between declarations, which may point to a later module's). ``filled_with``:
    another registry whose modules declare these too (metrics and loaders, model and generator kinds): loading
    either loads both, once."""

    def __init__(self, what: str, packages: Iterable[str] = (), entry_point_group: str = "",
                 after_load: Callable[[], None] | None = None, filled_with: "Registry | None" = None):
        super().__init__()
        self.what = what
        self.packages = list(packages)
        self.entry_point_group = entry_point_group
        self.after_load = after_load
        self.filled_with = filled_with
        self._state = "no"  # no | loading | done

    @property
    def state(self) -> str:
        return self.filled_with.state if self.filled_with is not None else self._state

    # ---- filling
    def modules(self) -> list[str]:
        from importlib.metadata import entry_points

        found = []
        for package_name in self.packages:
            package = importlib.import_module(package_name)
            found += [f"{package_name}.{info.name}" for info in pkgutil.iter_modules(package.__path__)
                      if not info.name.startswith("_")]
        return found + sorted({entry.module for entry in entry_points(group=self.entry_point_group)})

    def load(self) -> None:
        """Import the declaring modules once. A module that fails to import is an error naming it."""
        if self.filled_with is not None:
            return self.filled_with.load()
        if self._state != "no":
            return
        self._state = "loading"
        try:
            for module in self.modules():
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    raise ImportError(f"the {self.what}s declared in {module} could not be read: "
                                      f"{type(exc).__name__}: {exc}") from exc
            if self.after_load is not None:
                self.after_load()
        except BaseException:
            self._state = "no"
            raise
        self._state = "done"

    def registered(self, name: str) -> Any:
        """What is declared under ``name`` so far, or None. Registering never loads the declaring modules: a module
        run as a script (``python -m biasflow.metrics.stereoset``) registers as ``__main__`` without importing its
        own copy under its real name; a clash with a module loaded later is refused then, naming both."""
        return dict.get(self, name)

    def refuse_taken(self, name: str, module: str | None, old_module: str | None) -> None:
        """A second declaration under a taken name would silently replace the first: an error naming both modules
        (``old_module``: the holder's; the same module declaring again, as on a re-import, is fine)."""
        if old_module is not None and old_module != module:
            raise ValueError(f"{self.what} {name!r} is registered twice: by {old_module} and by {module}; give one "
                             f"of them another name")

    def add(self, name: str, value: Any, module: str | None, old_module: str | None = None) -> Any:
        """Declare ``value`` under ``name`` (``module``: the declaring one; ``refuse_taken`` first)."""
        self.refuse_taken(name, module, old_module)
        dict.__setitem__(self, name, value)
        return value

    # ---- reading (each loads the declaring modules first)
    def __getitem__(self, key):
        self.load()
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.load()
        return super().get(key, default)

    def __contains__(self, key) -> bool:
        self.load()
        return super().__contains__(key)

    def __iter__(self):
        self.load()
        return super().__iter__()

    def __len__(self) -> int:
        self.load()
        return super().__len__()

    def keys(self):
        self.load()
        return super().keys()

    def values(self):
        self.load()
        return super().values()

    def items(self):
        self.load()
        return super().items()

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {sorted(dict.keys(self))})"


__all__ = ["Registry"]
