"""R29 under attack: what a hostile server, witness, co-tenant or clock tried, and what
refuses it now (each test failed before its fix, or pins a property no other test does).

Fast and in-process: bundles from ``tests.support.bundles`` (real signatures and
proofs), the client's real HTTP code over ``httpx.MockTransport``, the witness's real
app and SQLite file through Starlette's test client, the collector's line filter.
"""

from __future__ import annotations

import base64
import hashlib
import sqlite3
import threading
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from domain import merkle
from domain.bundle import Accepted, TrustPolicy, verify_bundle
from domain.digests import event_id
from domain.errors import IntegrityFailure, InvalidInput, Stale
from domain.key_rotation import rotation_statement
from domain.notes import Checkpoint, SignerKey, WitnessKey, WitnessSigner
from domain.origin import log_identity_id
from ledger.audit.cosign import Witness as CollectedWitness
from ledger.client import CatalogClient
from ledger.log.checkpoint_line import CheckpointLine
from ledger.witness.app import create_app
from ledger.witness.protocol import Witness
from ledger.witness.state import WitnessState
from ledger.witness.submit import request_body
from tests.support.bundles import NOW, CatalogLog

APP = "app:shop"


@pytest.fixture(scope="module")
def log() -> CatalogLog:
    log = CatalogLog()
    for n in range(1, 4):
        log.publish({APP: {"n": n}, "app:other": {"n": -n}})
    return log


def view(log: CatalogLog, revision: int = 3) -> Any:
    return log.revisions[revision - 1].views[APP]


# -- the client ---------------------------------------------------------------------------


def _sharing(server: Any, log: Any, state: Path) -> CatalogClient:
    """A client of ``server`` keeping its state in ``state``, a file other clients share."""
    return CatalogClient(
        "http://catalog.test",
        transport=httpx.MockTransport(server.handle),
        trust=log.policy(),
        state_file=state,
        clock=lambda: NOW,
    )


def test_r29_one_witness_pinned_with_two_keys_counts_once(log: CatalogLog) -> None:
    """A policy may pin a witness's old and new key (its rotation); that witness
    cosigning with both is one witness, not two towards k = 2."""
    new_key = WitnessSigner.generate(log.witnesses[0].name)
    document = log.policy_json(threshold=2)
    document["witnesses"].append({"key": new_key.verifier.text()})
    policy = TrustPolicy.parse(document)
    body = log.checkpoint().text()
    note = log.log_key.sign(body)
    note += log.witnesses[0].cosign(body, NOW) + "\n" + new_key.cosign(body, NOW) + "\n"
    with pytest.raises(IntegrityFailure) as caught:
        verify_bundle(view(log), log.bundle(APP, note=note), policy, None, NOW)
    assert caught.value.details == {
        "reason": "too_few_cosignatures",
        "cosigned": 1,
        "threshold": 2,
    }
    # With a second witness it is two; and k cannot exceed the distinct witnesses.
    note += log.witnesses[1].cosign(body, NOW) + "\n"
    assert verify_bundle(view(log), log.bundle(APP, note=note), policy, None, NOW).size == 3
    two_names = {**document, "witnesses": document["witnesses"][:1] + document["witnesses"][3:]}
    with pytest.raises(InvalidInput) as refused:
        TrustPolicy.parse(two_names)
    assert refused.value.field == "threshold"


@pytest.mark.parametrize("now", [float("nan"), float("inf"), float("-inf")])
def test_r29_a_clock_that_is_no_time_fails_closed(log: CatalogLog, now: float) -> None:
    """``now`` is injected: NaN compared with anything is False, which made any head
    fresh; infinity crashed formatting the STALE details."""
    with pytest.raises(Stale) as caught:
        verify_bundle(view(log), log.bundle(APP), log.policy(), None, now)
    assert caught.value.details["axis"] == "freshness"


class Server:
    """The view route of a server serving the checkpoint of ``size``."""

    def __init__(self, log: CatalogLog) -> None:
        self.log = log
        self.size = len(log.revisions)

    def handle(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        since = int(params["since_size"]) if "since_size" in params else None
        body = self.log.revisions[self.size - 1].views[APP].to_json()
        body["proof"] = self.log.bundle(APP, size=self.size, since_size=since)
        return httpx.Response(200, content=orjson.dumps(body))


def test_r29_two_clients_sharing_a_state_file_never_move_it_back(
    log: CatalogLog, tmp_path: Path
) -> None:
    """Client A moves the shared state to 3; client B, which read the file at 1, is then
    served size 2 (a lagging replica). B used to accept 2 (it extends *its* 1) and write
    it over A's 3, so the next client accepted a rollback. B now starts from the file."""
    state = tmp_path / "state.json"
    server = Server(log)

    def client() -> CatalogClient:
        return _sharing(server, log, state)

    server.size = 1
    with client() as first:
        first.view(APP)
    with client() as a, client() as b:
        assert a.accepted == b.accepted == Accepted(1, log.checkpoint(1).root, 1)
        server.size = 3
        a.view(APP)
        server.size = 2
        with pytest.raises(Stale) as caught:
            b.view(APP)
        assert caught.value.details == {"axis": "checkpoint", "required": 3, "served": 2}
    assert orjson.loads(state.read_bytes())["size"] == 3


class RotatingServer(Server):
    """``Server``, and ``GET /v1/log/rotations`` answering ``rotations``."""

    def __init__(self, log: CatalogLog, rotations: dict[str, Any]) -> None:
        super().__init__(log)
        self.rotations = rotations

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/log/rotations":
            return httpx.Response(200, content=orjson.dumps(self.rotations))
        return super().handle(request)


def _rotations(log: CatalogLog, new: SignerKey) -> dict[str, Any]:
    """A main log whose last event rotates ``log.log_key`` to ``new``, its note signed by
    the log key and cosigned by every witness at ``NOW``."""
    main = log.origin.removesuffix("/catalog")
    statement = rotation_statement(main, log.log_key, new.verifier, NOW + 60)
    state = orjson.dumps({"statement": statement})
    ids = [bytes([n]) * 32 for n in range(3)]
    ids.append(event_id(log_identity_id().bytes, 2, b"log_key.rotated@1", state))
    leaves = [merkle.leaf_hash(i) for i in ids]
    body = Checkpoint(main, len(ids), merkle.root(leaves)).text()
    note = log.log_key.sign(body) + "".join(w.cosign(body, NOW) + "\n" for w in log.witnesses)
    event = {
        "aggregate_id": str(log_identity_id()),
        "version": 2,
        "topic": "log_key.rotated@1",
        "state_b64": base64.b64encode(state).decode(),
    }
    inclusion = [base64.b64encode(h).decode() for h in merkle.inclusion_proof(leaves, 3, 4)]
    return {
        "format": 1,
        "checkpoint": note,
        "rotations": [{"event": event, "leaf_index": 3, "inclusion": inclusion}],
    }


def test_r29_refresh_keys_never_writes_an_older_head_over_a_sharers(
    log: CatalogLog, tmp_path: Path
) -> None:
    """Client B, which read the shared state at size 1, learns a rotation after client A
    moved the state to 3: B used to write its size 1 (with the keys) over A's 3, without
    the file's lock. It now re-reads the file under the lock first: 3 and the keys stay."""
    state = tmp_path / "state.json"
    new = SignerKey.generate(log.log_key.name)
    server = RotatingServer(log, _rotations(log, new))

    def client() -> CatalogClient:
        return _sharing(server, log, state)

    server.size = 1
    with client() as first:
        first.view(APP)
    with client() as a, client() as b:
        server.size = 3
        a.view(APP)
        assert b.refresh_keys()[-1].key == new.verifier
        assert b.accepted == a.accepted == Accepted(3, log.checkpoint(3).root, 3)
    kept = orjson.loads(state.read_bytes())
    assert (kept["size"], [k["key"] for k in kept["log_keys"]]) == (
        3,
        [log.log_key.verifier.text(), new.verifier.text()],
    )


def test_r29_a_client_whose_clock_is_no_time_fails_closed(log: CatalogLog) -> None:
    """The client's key ring took ``int(now)`` first: a NaN clock was a ValueError (a
    traceback) before ``verify_bundle`` could refuse it. Now STALE, axis freshness."""
    server = Server(log)
    with (
        CatalogClient(
            "http://catalog.test",
            transport=httpx.MockTransport(server.handle),
            trust=log.policy(),
            clock=lambda: float("nan"),
        ) as client,
        pytest.raises(Stale) as caught,
    ):
        client.view(APP)
    assert caught.value.details["axis"] == "freshness"


# -- the witness --------------------------------------------------------------------------

ORIGIN = "log.example/hostile"
LOG_KEY = SignerKey.generate(ORIGIN)
WITNESS_KEY = WitnessSigner.generate("witness.example/hostile")
LEAVES = [merkle.leaf_hash(b"leaf %d" % i) for i in range(8)]
FORK = [merkle.leaf_hash(b"fork %d" % i) for i in range(8)]


def _note(size: int, leaves: list[bytes] = LEAVES) -> str:
    return LOG_KEY.sign(Checkpoint(ORIGIN, size, merkle.root(leaves[:size])).text())


def _witness(path: Path) -> tuple[Witness, TestClient]:
    witness = Witness(WitnessState(path), WITNESS_KEY, {ORIGIN: [LOG_KEY.verifier]}, lambda: 1000)
    return witness, TestClient(create_app(witness), raise_server_exceptions=False)


def test_r29_witness_refuses_a_size_past_2_63_without_a_crash(tmp_path: Path) -> None:
    """A log-signed checkpoint of size 2^63 parsed (19 digits) and crashed the SQLite
    write with an OverflowError: HTTP 500 and a traceback. Now 400, nothing kept."""
    witness, client = _witness(tmp_path / "w.db")
    body = f"{ORIGIN}\n{2**63}\n{base64.b64encode(bytes(32)).decode()}\n"
    answer = client.post("/add-checkpoint", content=request_body(LOG_KEY.sign(body), 0, []))
    assert (answer.status_code, answer.text) == (
        400,
        f"the checkpoint's size is past {2**63 - 1}, more than this witness keeps\n",
    )
    assert witness.state.known(ORIGIN) is None


def test_r29_witness_file_rewound_under_a_running_witness_is_refused(tmp_path: Path) -> None:
    """Whoever can write the witness's file while it runs rewinds its row (here: back to
    nothing); the witness then cosigned a fork of the tree it had cosigned. It now
    remembers what it cosigned and answers 503 until an operator looks."""
    _, client = _witness(tmp_path / "w.db")
    assert client.post("/add-checkpoint", content=request_body(_note(5), 0, [])).status_code == 200
    with sqlite3.connect(tmp_path / "w.db") as db:
        db.execute("DELETE FROM cosigned")
    answer = client.post("/add-checkpoint", content=request_body(_note(5, FORK), 0, []))
    assert answer.status_code == 503, answer.text
    assert "edited or replaced" in answer.text
    with sqlite3.connect(tmp_path / "w.db") as db:
        assert db.execute("SELECT count(*) FROM cosigned").fetchone() == (0,)


def test_r29_witness_file_corrupt_or_hand_edited_is_503_not_a_traceback(tmp_path: Path) -> None:
    """A witness file that is no SQLite database (InvalidInput from the connection) was a
    500 and a traceback on both routes; a ``cosigned.root`` hand-edited to TEXT reached
    the consistency check as a str (TypeError, 500) in a restarted witness. Now 503 with
    a message: the file's trouble, or the table's row at fault."""
    path = tmp_path / "w.db"
    _, client = _witness(path)
    assert client.post("/add-checkpoint", content=request_body(_note(1), 0, [])).status_code == 200
    with sqlite3.connect(path) as db:
        db.execute("UPDATE cosigned SET root = 'not a hash'")
    _, restarted = _witness(path)
    proof = merkle.consistency_proof(LEAVES[:2], 1, 2)
    answer = restarted.post("/add-checkpoint", content=request_body(_note(2), 1, proof))
    assert answer.status_code == 503 and "table cosigned" in answer.text, answer.text
    origin_hash = hashlib.sha256(ORIGIN.encode()).hexdigest()  # tlog-witness's path
    got = restarted.get(f"/{origin_hash}/checkpoint")
    assert got.status_code == 503 and "table cosigned" in got.text, got.text
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"not a database" * 512)
    for answer in (
        client.post("/add-checkpoint", content=request_body(_note(2), 1, proof)),
        client.get(f"/{origin_hash}/checkpoint"),
    ):
        assert answer.status_code == 503 and "not a witness file" in answer.text, answer.text


def test_r29_concurrent_fork_requests_get_one_root_cosigned(tmp_path: Path) -> None:
    """Sixteen requests at once, half for one root of size 5 and half for a fork of it,
    all from size 0: exactly one is cosigned, every other is told the size now known
    (409), and the kept row is the winner's."""
    witness, client = _witness(tmp_path / "w.db")
    answers: list[tuple[int, int]] = []
    barrier = threading.Barrier(16)

    def submit(n: int) -> None:
        body = request_body(_note(5, FORK if n % 2 else LEAVES), 0, [])
        barrier.wait()
        answers.append((n % 2, client.post("/add-checkpoint", content=body).status_code))

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(status for _, status in answers) == [200] + [409] * 15
    winner = next(side for side, status in answers if status == 200)
    kept = witness.state.known(ORIGIN)
    assert kept is not None and kept.root == merkle.root((FORK if winner else LEAVES)[:5])


# -- the collector ------------------------------------------------------------------------


def test_r29_collector_keeps_one_valid_line_per_witness(log: CatalogLog) -> None:
    """A witness's answer: garbage, another pinned witness's valid line, its own line
    for another body, and 150 valid lines of its own. Only its newest valid line is
    kept: 150 would have made the stored note unreadable to every client (more than
    the 100 signatures a note may carry), one witness denying all reads."""
    body = log.checkpoint().text()
    mine, other = log.witnesses[0], log.witnesses[1]
    answer = [
        "not a signature line",
        "\u2014 " + mine.name + " AAAA",
        other.cosign(body, NOW),
        mine.cosign(log.checkpoint(2).text(), NOW + 999),
        *(mine.cosign(body, NOW - n) for n in range(150)),
    ]
    collected = CollectedWitness(WitnessKey.parse(mine.verifier.text()), "http://w0.test")
    assert collected.valid_lines(body, answer) == [mine.cosign(body, NOW)]
    assert collected.valid_lines(body, answer[:4]) == []


def test_r29_witness_answers_408_to_a_slow_loris_body(tmp_path: Path) -> None:
    """A client that sends the first bytes of a body and then nothing used to hold the
    request open for ever (one connection each, until the witness ran out of them).
    The body now has a deadline (here 50 ms): 408, and nothing was cosigned."""
    witness = Witness(
        WitnessState(tmp_path / "w.db"), WITNESS_KEY, {ORIGIN: [LOG_KEY.verifier]}, lambda: 1000
    )
    app = create_app(witness, body_seconds=0.05)
    sent: list[MutableMapping[str, Any]] = []
    first = request_body(_note(5), 0, [])[:10]

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append({})
            return {"type": "http.request", "body": first, "more_body": True}
        await anyio.sleep(3600)  # the rest never comes
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/add-checkpoint",
        "raw_path": b"/add-checkpoint",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", b"1000")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }

    async def request() -> None:
        with anyio.fail_after(5):  # never the hour the body would take
            await app(scope, receive, send)

    anyio.run(request)
    assert sent[1]["status"] == 408
    assert sent[2]["body"] == b"the body took more than 0.05 seconds\n"
    assert witness.state.known(ORIGIN) is None


def test_r29_collector_counts_no_replayed_stale_cosignature(log: CatalogLog) -> None:
    """The catalog unchanged, the body is the same as yesterday's: a witness that replays
    yesterday's valid line is counted as cosigned, and the collector reports success
    for a note clients find STALE. A line older than the clients' maximum age must not
    count."""
    body = log.checkpoint().text()
    witness = log.witnesses[0]
    collected = CollectedWitness(WitnessKey.parse(witness.verifier.text()), "http://w0.test")
    replayed = [witness.cosign(body, NOW - 86_400)]
    keep = collected.valid_lines
    assert keep(body, replayed, not_before=NOW - 3600) == []
    fresh = [witness.cosign(body, NOW - 60)]
    assert keep(body, replayed + fresh, not_before=NOW - 3600) == fresh


def test_r29_a_checkpoint_note_with_two_bodies_is_no_checkpoint(log: CatalogLog) -> None:
    """signed-note's text ends at the *last* blank line; Checkpoint.parse read up to the
    first. A note "true body, blank line, fork body, blank line, signatures" was taken
    as the true checkpoint by import (an export's checkpoint line) and by serve's check of
    the stored row, though what it signs is the fork. Now it is no checkpoint at all."""
    true, fork = log.checkpoint(3), Checkpoint(log.origin, 3, bytes(32))
    note = log.log_key.sign(true.text() + "\n" + fork.text())
    line = {
        "checkpoint": 1,
        "origin": true.origin,
        "size": 3,
        "root": base64.b64encode(true.root).decode(),
        "note": note,
        "stored_at_us": 1,
    }
    with pytest.raises(InvalidInput) as caught:
        CheckpointLine.parse(line, line=7)
    assert caught.value.details == {"field": "checkpoint.note", "line": 7}
    with pytest.raises(InvalidInput):
        Checkpoint.parse(note)
    # The client refused it already (its cosignature check reads the last blank line).
    with pytest.raises(IntegrityFailure) as refused:
        verify_bundle(view(log), log.bundle(APP, note=note), log.policy(), None, NOW)
    assert refused.value.details["reason"] == "malformed_proof"
