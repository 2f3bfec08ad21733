"""isosweep from Python (docs/python.md).

    import isosweep

    with isosweep.Client("http://127.0.0.1:8000") as c:        # a running `isosweep serve`
        sweep = c.submit("examples/demo.yaml", wait=True)
        frame = c.metrics(sweep["id"], metric="grad_norm", epoch=0, layer=1)

    isosweep.isometry_strength("relu")                         # theory: (3π − 4)/(2π − 2)
    records = list(isosweep.fit({"depth": 8, "epochs": 1}))    # one trial, here (torch)

The client and its errors are imported at once; everything else (the store, the theory, the
plots, and `fit`, which imports torch) on first use (PEP 562), so a notebook that only talks
to a server never loads torch or Ray. The implementation lives in service/ (no torch),
workers/ (torch, Ray) and api/ (the server and the CLI).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from isosweep.client import ApiError, ApiUnreachable, Client, ClientError, SpecError
from service import __version__
from service.errors import InvalidInput, IsosweepError

# name → the module it comes from, imported when the name is first read.
_LAZY: dict[str, str] = {
    # training (torch) and sweeps (Ray)
    "fit": "workers.train",
    # measurement of any torch module (docs/probe.md; torch)
    "probe": "workers.probe",
    "Monitor": "isosweep.monitor",
    "register_metric": "workers.custom_metrics",
    "run_sweep": "workers.driver",
    # configs, specs, settings, the store
    "TrialConfig": "service.config",
    "METRICS": "service.config",
    "SweepSpec": "service.spec",
    "load_spec": "service.spec",
    "parse_spec": "service.spec",
    "expand": "service.spec",
    "Settings": "service.settings",
    "Store": "service.store",
    "register_model": "service.models",
    # measurements and theory (Joudaki et al. 2023)
    "isometry_gap": "service.isometry",
    "hermite_coefficients": "service.theory",
    "moments": "service.theory",
    "isometry_strength": "service.theory",
    "kappa_prime0": "service.theory",
    "dual_activation": "service.theory",
    "kappa": "service.theory",
    "mean_field_grams": "service.theory",
    "mean_field_gaps": "service.theory",
    "activation_summary": "service.theory",
    "registry_summary": "service.theory",
    "predict": "service.theory",
    # plots of tidy frames, and of stored sweeps
    "render": "service.plots",
    "build_figure": "service.plots",
    "PLOT_KINDS": "service.plots",
    "make_plot": "service.plots.stored",
}

__all__ = [  # the client at once, the rest (_LAZY) on first use
    "METRICS",
    "PLOT_KINDS",
    "ApiError",
    "ApiUnreachable",
    "Client",
    "ClientError",
    "InvalidInput",
    "IsosweepError",
    "Monitor",
    "Settings",
    "SpecError",
    "Store",
    "SweepSpec",
    "TrialConfig",
    "__version__",
    "activation_summary",
    "build_figure",
    "dual_activation",
    "expand",
    "fit",
    "hermite_coefficients",
    "isometry_gap",
    "isometry_strength",
    "kappa",
    "kappa_prime0",
    "load_spec",
    "make_plot",
    "mean_field_gaps",
    "mean_field_grams",
    "moments",
    "parse_spec",
    "predict",
    "probe",
    "register_metric",
    "register_model",
    "registry_summary",
    "render",
    "run_sweep",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'isosweep' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # read once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from isosweep.monitor import Monitor
    from service.config import METRICS, TrialConfig
    from service.isometry import isometry_gap
    from service.plots import PLOT_KINDS, build_figure, render
    from service.plots.stored import make_plot
    from service.settings import Settings
    from service.spec import SweepSpec, expand, load_spec, parse_spec
    from service.store import Store
    from service.theory import (
        activation_summary,
        dual_activation,
        hermite_coefficients,
        isometry_strength,
        kappa,
        kappa_prime0,
        mean_field_gaps,
        mean_field_grams,
        moments,
        registry_summary,
    )
    from workers.custom_metrics import register_metric
    from workers.driver import run_sweep
    from workers.probe import probe
    from workers.train import fit
