"""The HTTP edge (FastAPI app, dashboard) and the `isosweep` CLI."""
