"""isosweep's core: settings, specs, store, theory, plots. No FastAPI, Ray or torch here."""

__version__ = "0.1.0"
