"""Runtime reading (R18, R19) end to end: enter through `apply` of real manifests, exit
through the Python reader, the CLI and HTTP against a started server on loopback."""

from __future__ import annotations

import json
import sys
import threading
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from domain.errors import IntegrityFailure, InvalidInput, LedgerError, Missing, Stale
from domain.identity import Audience
from projections.reader import MISSING_MESSAGE, CatalogReader, parse_audience, parse_revision
from tests.support.cli_inprocess import cli
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import component, pack_json, sales_closure
from tests.support.gitrepo import sales as sales_pack
from tests.support.lifecycle_support import World

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("catalog-ledger"))


def sales(version: int) -> bytes:
    """Every payload carries the version; a requirement-free push contract rides along."""
    return sales_pack(version, stamp_all=True, ping=True)


closure = sales_closure


@pytest.fixture
def published(world: World) -> Iterator[tuple[World, ServedStore]]:
    c1 = world.release({"sales/pack.json": sales(1)})
    world.service.apply(
        world.manifest(
            [world.official("sales", c1)],
            closure("integration:erp-sync")
            + closure("app:crm", "erp-test")
            + closure("integration:gone"),
        )
    )
    # Revoke one audience in a later release: its view must look like a never-seen one.
    world.service.apply(
        world.manifest(
            [world.official("sales", c1)],
            closure("integration:erp-sync") + closure("app:crm", "erp-test"),
        )
    )
    server = ServedStore(world.url)
    yield world, server
    server.close()


def _python(world: World, audience: str, min_revision: Any = None) -> dict[str, Any]:
    kind, _, ident = audience.partition(":")
    try:
        view = CatalogReader(world.db).view(
            parse_audience(kind, ident), min_revision=parse_revision(min_revision)
        )
    except LedgerError as exc:
        return {"status": exc.code, "body": exc.to_json()}
    return {"status": "OK", "body": view.to_json()}


def _cli(world: World, audience: str, min_revision: Any = None) -> dict[str, Any]:
    args = ["--db", world.url, "view", audience, "--json"]
    if min_revision is not None:
        args += ["--min-revision", str(min_revision)]
    out = cli(*args)  # in-process: the command's answer is compared, not a process
    body = out.json()
    codes = {0: "OK", 3: "INVALID", 5: body.get("error"), 6: "INTEGRITY"}
    return {"status": codes.get(out.code, out.code), "body": body}


def _http(server: ServedStore, audience: str, min_revision: Any = None) -> dict[str, Any]:
    params = {} if min_revision is None else {"min_revision": min_revision}
    response = server.view(audience, **params)
    codes = {200: "OK", 400: "INVALID", 404: "MISSING", 409: "STALE", 500: "INTEGRITY"}
    return {"status": codes[response.status_code], "body": response.json(), "raw": response.content}


CASES = [
    ("integration:erp-sync", None, "OK"),
    ("app:crm", 2, "OK"),
    ("app:crm", 3, "STALE"),
    ("workload:erp-sync", None, "INVALID"),
    ("integration: erp-sync", None, "INVALID"),
    ("app:crm", -1, "INVALID"),
    ("integration:never-seen", None, "MISSING"),
    ("integration:gone", None, "MISSING"),
    ("integration:ERP-sync", None, "MISSING"),
]


def test_r19_every_outcome_through_python_cli_and_http(
    published: tuple[World, ServedStore],
) -> None:
    world, server = published
    for audience, min_revision, expected in CASES:
        results = [
            _python(world, audience, min_revision),
            _cli(world, audience, min_revision),
            _http(server, audience, min_revision),
        ]
        for boundary, result in zip(("python", "cli", "http"), results, strict=True):
            assert result["status"] == expected, (boundary, audience, result)
        if expected == "OK":
            assert results[0]["body"] == results[1]["body"] == results[2]["body"]
            assert {f["key"] for f in results[0]["body"]["facts"]} == {
                "Order.push",
                "erp",
                "Order.out",
            }
        elif expected == "STALE":
            details = results[2]["body"]["details"]
            assert details == {"axis": "revision", "required_revision": 3, "served_revision": 2}
        elif expected == "INVALID":
            part = results[2]["body"]["details"]["part"]
            assert part == (
                "revision"
                if min_revision == -1
                else "kind"
                if audience.startswith("workload")
                else "id"
            )
    missing = {_http(server, a, None)["raw"] for a, _, e in CASES if e == "MISSING"}
    assert missing == {
        json.dumps(
            {"error": "MISSING", "message": MISSING_MESSAGE, "details": {}}, separators=(",", ":")
        ).encode()
    }


def test_r19_etag_is_weak_from_the_audience_digest_and_304_on_match(
    published: tuple[World, ServedStore],
) -> None:
    _, server = published
    first = server.view("integration:erp-sync")
    etag = first.headers["etag"]
    assert etag == f'W/"{first.json()["audience_digest"]}"'
    again = server.client.get(first.request.url, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    head = server.client.get("/v1/catalog/head").json()
    assert head == {"revision": 2, "content_digest": first.json()["content_digest"]}
    health = server.client.get("/healthz")
    assert health.status_code == 200 and health.json()["catalog_revision"] == 2


def test_r19_tampered_snapshot_rows_give_integrity_not_data(
    published: tuple[World, ServedStore],
) -> None:
    world, server = published
    with world.db.write() as conn:
        conn.execute(
            sa.text("UPDATE view_pack_component SET fact = :f WHERE kind = :k"),
            {
                "f": b'{"credential_sets":null,"key":"Order.out","kind":"outbound_mapping",'
                b'"payload":{"fields":["id","secret"],"v":1},"requires":[]}',
                "k": b"outbound_mapping",
            },
        )
    response = server.view("integration:erp-sync")
    assert response.status_code == 500 and response.json()["error"] == "INTEGRITY"
    assert "fields" not in response.text
    with pytest.raises(IntegrityFailure):
        CatalogReader(world.db).view(Audience.parse("app:crm"))
    assert cli("--db", world.url, "view", "app:crm", "--json").code == 6


def test_r19_tampered_grant_row_fails_the_audience_digest(world: World) -> None:
    c1 = world.release({"sales/pack.json": sales(1)})
    world.service.apply(
        world.manifest(
            [world.official("sales", c1)], [*closure("integration:a"), *closure("integration:b")]
        )
    )
    with world.db.write() as conn:  # move b's credential set edge onto the test set
        conn.execute(
            sa.text(
                "UPDATE view_catalog_grant SET credential_set = :n "
                "WHERE audience_id = :a AND credential_set = :o"
            ),
            {"n": b"erp-test", "a": b"b", "o": b"erp-prod"},
        )
    with pytest.raises(IntegrityFailure):
        CatalogReader(world.db).view(Audience.parse("integration:b"))
    assert CatalogReader(world.db).view(Audience.parse("integration:a")).revision == 1


def test_r18_bound_generation_no_longer_active_is_stale_not_served(world: World) -> None:
    c1, c2 = (world.release({"sales/pack.json": sales(v)}) for v in (1, 2))
    world.service.apply(world.manifest([world.official("sales", c1)], closure("integration:a")))
    world.service.apply(
        world.manifest([world.official("sales", c2)], closure("integration:a")), publish=False
    )  # activation moved; the catalog not yet republished
    with pytest.raises(Stale) as info:
        CatalogReader(world.db).view(Audience.parse("integration:a"))
    assert info.value.details["axis"] == "activation"
    world.service.publish()
    assert CatalogReader(world.db).view(Audience.parse("integration:a")).revision == 2


def test_r5_local_path_pack_never_appears_in_any_view(world: World) -> None:
    c1 = world.release({"sales/pack.json": sales(1)})
    folder = world.tmp / "dev"
    folder.mkdir()
    (folder / "pack.json").write_bytes(
        pack_json("dev", "app", [component("push_contract", "Order.push")])
    )
    world.service.apply(
        world.manifest(
            [
                world.official("sales", c1),
                {"name": "dev", "source": {"kind": "local_path", "path": str(folder)}},
            ],
            closure("integration:a") + closure("app:b", "erp-test"),
        )
    )
    for audience in ("integration:a", "app:b"):
        view = CatalogReader(world.db).view(Audience.parse(audience))
        assert {f["pack"] for f in view.facts} == {"sales"}
    with pytest.raises(LedgerError):
        world.service.apply(
            world.manifest(
                [
                    world.official("sales", c1),
                    {"name": "dev", "source": {"kind": "local_path", "path": str(folder)}},
                ],
                [
                    {
                        "audience": "app:b",
                        "pack": "dev",
                        "kind": "push_contract",
                        "key": "Order.push",
                    }
                ],
            )
        )


def test_r18_reader_never_sees_a_mix_of_revisions_while_releases_publish(world: World) -> None:
    commits = [world.release({"sales/pack.json": sales(v)}) for v in range(1, 13)]
    world.service.apply(
        world.manifest([world.official("sales", commits[0])], closure("integration:a"))
    )
    seen: list[tuple[int, set[int]]] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    reader = CatalogReader(world.db)

    def read() -> None:
        try:
            while not stop.is_set():
                view = reader.view(Audience.parse("integration:a"))
                seen.append((view.revision, {f["payload"]["v"] for f in view.facts}))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        for commit in commits[1:]:
            world.service.apply(
                world.manifest([world.official("sales", commit)], closure("integration:a"))
            )
    finally:
        stop.set()
        thread.join(timeout=60)
    assert errors == []
    assert len({revision for revision, _ in seen}) > 2
    for revision, versions in seen:
        assert versions == {revision}  # release v is revision v: one generation per view


AUDIENCES = [
    "integration:a",
    "integration:A",
    "app:a",
    f"app:{unicodedata.normalize('NFD', 'é')}",
    f"app:{unicodedata.normalize('NFC', 'é')}",
    "integration:ops",
]


@st.composite
def binding_sets(draw: st.DrawFn) -> dict[str, set[str]]:
    """Per audience: which of the pack's closures it binds (always complete)."""
    out = {}
    for audience in draw(st.lists(st.sampled_from(AUDIENCES), unique=True, max_size=5)):
        out[audience] = draw(st.sets(st.sampled_from(["order", "ping"]), min_size=1))
    return out


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chosen=binding_sets())
def test_r19_every_view_is_exactly_the_audiences_own_closure(
    world: World, chosen: dict[str, set[str]]
) -> None:
    commit = (
        world.release({"sales/pack.json": sales(1)})
        if not world.repo.commits
        else world.repo.commits[0]
    )
    bindings = []
    for audience, parts in chosen.items():
        if "order" in parts:
            bindings += closure(audience)
        if "ping" in parts:
            bindings.append(
                {"audience": audience, "pack": "sales", "kind": "push_contract", "key": "Ping.push"}
            )
    world.service.apply(world.manifest([world.official("sales", commit)], bindings))
    reader = CatalogReader(world.db)
    for audience in AUDIENCES:
        expected = {
            (b["kind"], b["key"], b.get("credential_set"))
            for b in bindings
            if b["audience"] == audience
        }
        if not expected:
            with pytest.raises(Missing):
                reader.view(Audience.parse(audience))
            continue
        view = reader.view(Audience.parse(audience))
        assert {(g["kind"], g["key"], g["credential_set"]) for g in view.grants} == expected
        assert {(f["kind"], f["key"]) for f in view.facts} == {(k, key) for k, key, _ in expected}


def test_r19_invalid_requests_name_the_part() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_audience("app", "x" * 256)
    assert info.value.details["part"] == "id"
    with pytest.raises(InvalidInput) as info:
        parse_revision("1e3")
    assert info.value.details["part"] == "revision"


def test_r19_openapi_document_is_current() -> None:
    from ledger.cli.app import dump_json
    from ledger.http.app import openapi_document

    checked_in = (ROOT / "schema" / "openapi.json").read_text(encoding="utf-8")
    assert checked_in == dump_json(openapi_document()), (
        "schema/openapi.json is stale: run `catalog-ledger schema dump` and commit it"
    )
