"""R25: a view is served and written only by code of the view's own version."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from ledger.api import Store
from ledger.http.app import create_app
from projections.views.catalog import CatalogView
from tests.support.cli_inprocess import cli_json
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World


def test_r25_a_view_built_by_other_code_fails_reads_and_decisions_closed_until_rebuilt(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    assert cli_json("--db", world.url, "view", "integration:a")[0] == 0
    # This program's catalog view code is one version newer than the code that built it.
    monkeypatch.setattr(CatalogView, "version", CatalogView.version + 1)
    code, error = cli_json("--db", world.url, "view", "integration:a")
    assert (code, error["error"], error["details"]["view"]) == (5, "STALE", "catalog"), error
    assert "projections rebuild catalog" in error["message"]
    before = world.tables()
    manifest = world.manifest([world.official("sales", world.commit("sales", 2))], bindings)
    for args in (("apply", str(manifest)), ("publish",)):
        code, error = cli_json("--db", world.url, *args)
        assert (code, error["error"]) == (5, "STALE"), (args, error)
    assert world.tables() == before  # refused before appending anything
    store = Store(world.url)
    with TestClient(create_app(store.opener())) as client:
        health = client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["projections"]["catalog"]["rebuild_needed"] is True
    code, rebuilt = cli_json("--db", world.url, "projections", "rebuild", "catalog")
    assert code == 0, rebuilt
    code, view = cli_json("--db", world.url, "view", "integration:a")
    assert code == 0 and view["revision"] == 1
    with TestClient(create_app(store.opener())) as client:
        assert client.get("/healthz").status_code == 200
    store.close()


def test_r25_apply_and_serve_rebuild_stale_views_themselves_when_asked(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    bindings = push_closure("integration:a", "sales")
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    monkeypatch.setattr(CatalogView, "version", CatalogView.version + 1)
    with Store(world.url) as store:
        assert store.stale_views() == ["catalog"]
    # serve --rebuild-stale rebuilds before it listens (the server itself is not run here).
    served: list[list[str]] = []

    def listen(*_: object, **__: object) -> None:
        with Store(world.url) as s:
            served.append(s.stale_views())

    monkeypatch.setattr(uvicorn, "run", listen)
    code, listening = cli_json("--db", world.url, "serve", "--port", "0", "--rebuild-stale")
    assert code == 0 and served == [[]], listening
    code, view = cli_json("--db", world.url, "view", "integration:a")
    assert code == 0 and view["revision"] == 1
    # apply --rebuild-stale on a view that is stale again goes on to publish.
    monkeypatch.setattr(CatalogView, "version", CatalogView.version + 1)
    manifest = world.manifest([world.official("sales", world.commit("sales", 2))], bindings)
    assert cli_json("--db", world.url, "apply", str(manifest))[1]["error"] == "STALE"
    code, applied = cli_json("--db", world.url, "apply", str(manifest), "--rebuild-stale")
    assert code == 0 and applied["catalog"]["revision"] == 2, applied
    with Store(world.url) as store:
        assert store.stale_views() == []
