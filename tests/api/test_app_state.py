"""api.app.set_state: an app given new settings and a new store answers as a new app would —
nothing of the previous store's answers (the read cache), of its callers (throttles, the
heavy-read queue) or of its settings (the OpenAPI document's security) is left."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
from api_support import fill, spec

from api.app import create_app, set_state
from api.server import ServerThread
from service.settings import Settings
from service.store import Store


def test_an_app_given_a_new_store_answers_from_it_alone(tmp_path):
    first = Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}")
    second = Settings(database_url=f"sqlite:///{tmp_path / 'b.db'}", api_token="t" * 32)
    with Store(first.database_url, settings=first) as a, Store(second.database_url) as b:
        app = create_app(first, store=a)
        server = ServerThread(app).start()
        try:
            with httpx.Client(base_url=f"{server.url}/api/v1") as client:
                made = client.post("/sweeps", json=spec("in a", depth=[2])).json()
                fill(SimpleNamespace(get=client.get, store=a), made["id"])
                frame = client.get(f"/sweeps/{made['id']}/metrics", params={"metric": "grad_norm"})
                assert frame.status_code == 200 and frame.json()["data"]
                assert (
                    client.get(f"{server.url}/openapi.json")
                    .json()["components"]
                    .get("securitySchemes")
                    is None
                )
                before = {k: getattr(app.state, k, None) for k in ("cache", "heavy_reads")}
                assert before["heavy_reads"] is not None  # the metrics read made it
        finally:
            server.stop()

        set_state(app, second, store=b)
        assert app.state.store is b and app.state.settings is second
        assert app.state.cache is not before["cache"] and not hasattr(app.state, "heavy_reads")
        server = ServerThread(app).start()
        try:
            with httpx.Client(base_url=f"{server.url}/api/v1") as client:
                # the second settings' token guards the API now, and the document says so
                assert client.post("/sweeps", json=spec("in b")).status_code == 401
                auth = {"Authorization": "Bearer " + "t" * 32}
                assert client.get("/sweeps", headers=auth).json()["data"] == []
                gone = client.get(f"/sweeps/{made['id']}/metrics", headers=auth,
                                  params={"metric": "grad_norm"})  # fmt: skip
                assert gone.status_code == 404  # not the first store's cached frame
                doc = client.get(f"{server.url}/openapi.json", headers=auth).json()
                assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        finally:
            server.stop()
