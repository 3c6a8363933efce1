"""Where the workflow files of an installed biasflow are (the Snakefile, workflow/, scripts/, conf/), so that
``biasflow run`` and ``biasflow.api`` work in any folder, writing results there.

* a checkout (an editable install, ``pip install -e .``): the checkout itself;
* a wheel (``pip install biasflow-*.whl``, ``pip install git+...``): the copy the wheel installs under
  ``<prefix>/share/biasflow`` (``[tool.setuptools.data-files]`` in pyproject.toml).

The user's own folder wins: a Snakefile or ``conf/`` there (or ``BIASFLOW_ROOT`` / ``BIASFLOW_CONF``) is used first.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path


def installed_project() -> Path | None:
    """The folder holding the shipped Snakefile, workflow/, scripts/ and conf/; None if this install has none."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "Snakefile").is_file() and (checkout / "workflow").is_dir():
        return checkout
    # the prefix this copy of the package was installed into (<prefix>/lib/pythonX.Y/site-packages/biasflow), then
    # the interpreter's and the user's data folders
    here = Path(__file__).resolve()
    prefixes = [here.parents[4]] if len(here.parents) > 4 else []
    prefixes += [Path(sysconfig.get_path("data")), Path(sysconfig.get_path("data", "posix_user"))]
    for prefix in prefixes:
        shared = prefix / "share" / "biasflow"
        if (shared / "Snakefile").is_file():
            return shared
    return None


__all__ = ["installed_project"]
