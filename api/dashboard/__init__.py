"""The dashboard at `/`: server-rendered pages over the store, a small script that refreshes
them while sweeps run, no assets from other hosts (api/dashboard/pages.py; docs/dashboard.md).
api.app includes `router`."""

from api.dashboard.pages import router

__all__ = ["router"]
