"""Every model and dataset module, imported so the CLI can list and resolve them by class path."""

from __future__ import annotations

from importlib import import_module

MODEL_MODULES = (
    "xbench.models.baselines",
    "xbench.models.clip",
    "xbench.models.biomedclip",
    "xbench.models.medklip",
    "xbench.models.mavl",
    "xbench.models.kad",
    "xbench.models.devide",
    "xbench.models.carzero",
    "xbench.models.hf_dual_encoder",
)
DATA_MODULES = (
    "xbench.data.chestx_det10",
    "xbench.data.phantom",
    "xbench.data.rsna",
    "xbench.data.siim",
    "xbench.data.covid_rural",
    "xbench.data.chexlocalize",
    "xbench.data.chestxray14",
    "xbench.data.vindr",
    "xbench.data.ms_cxr",
)


def load_all() -> None:
    for module in (*MODEL_MODULES, *DATA_MODULES):
        import_module(module)
