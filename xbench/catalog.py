"""The models and datasets XBench ships, found where they live.

Every module of ``xbench.models`` and ``xbench.data`` is imported, and every public, concrete
subclass of ``XBenchModel`` and ``XBenchDataModule`` they define is in the catalogue: LightningCLI
lists the same classes in ``python -m xbench.test --help`` and resolves their short names
(``--model CheXzero``). A new model or dataset is a new module in its package; nothing is listed
here. Abstract bases (``XBenchModel``, the open_clip and query-decoder families) are left out, as a
class whose name starts with ``_`` is.
"""

from __future__ import annotations

import inspect
import pkgutil
from importlib import import_module

#: The packages whose every module is imported.
PACKAGES = ("xbench.models", "xbench.data")


def load_all() -> None:
    """Import every module of `PACKAGES`, so that their classes are known subclasses."""
    for name in PACKAGES:
        package = import_module(name)
        for module in pkgutil.iter_modules(package.__path__, f"{name}."):
            import_module(module.name)


def shipped(base: type) -> list[type]:
    """The concrete public subclasses of ``base`` that XBench's own packages define, by class path."""
    found, stack = {}, [base]
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        path = f"{cls.__module__}.{cls.__qualname__}"
        if cls.__module__.startswith(PACKAGES) and not inspect.isabstract(cls) and "._" not in path \
                and "<locals>" not in path:
            found[path] = cls
    return [found[path] for path in sorted(found)]


def models() -> list[type]:
    """Every model class XBench ships."""
    from xbench.models.base import XBenchModel  # noqa: PLC0415 -- the packages load in load_all

    load_all()
    return shipped(XBenchModel)


def datasets() -> list[type]:
    """Every dataset class XBench ships."""
    from xbench.data.base import XBenchDataModule  # noqa: PLC0415 -- the packages load in load_all

    load_all()
    return shipped(XBenchDataModule)
