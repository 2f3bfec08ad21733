"""isosweep's core: settings, specs, the store, theory and plots. Imports neither FastAPI, Ray nor torch."""

__version__ = "0.1.0"
