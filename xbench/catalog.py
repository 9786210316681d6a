"""Every model and dataset module, imported so the CLI can list and resolve them by class path."""

from __future__ import annotations

from importlib import import_module

MODEL_MODULES = ("xbench.models.baselines", "xbench.models.kad", "xbench.models.devide")
DATA_MODULES = ("xbench.data.chestx_det10", "xbench.data.phantom")


def load_all() -> None:
    for module in (*MODEL_MODULES, *DATA_MODULES):
        import_module(module)
