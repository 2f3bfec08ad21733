"""The dashboard at `/`: server-rendered pages over the store, a small script that refreshes
them while sweeps run, no assets from other hosts (api/dashboard/pages.py; docs/dashboard.md),
and, with a token, its login page (api/dashboard/login.py). api.app includes `router`."""

from api.dashboard import login
from api.dashboard.pages import router

router.include_router(login.router)

__all__ = ["router"]
