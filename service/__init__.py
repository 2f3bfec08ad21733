"""isosweep's core: settings, specs, store, theory, plots. Imports neither FastAPI, Ray nor torch."""

__version__ = "0.1.0"
