"""R29: the witness answers C2SP tlog-witness ``add-checkpoint`` with the spec's codes
(400, 403, 404, 409 ``text/x.tlog.size``, 422, 200 cosignature lines), over its HTTP
app in-process; and the submit client maps each answer to its typed error."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from domain import merkle
from domain.errors import IntegrityFailure, Unavailable
from domain.notes import Checkpoint, SignerKey, WitnessSigner, verify_cosignatures
from ledger.witness.app import create_app
from ledger.witness.protocol import MAX_BODY, Witness
from ledger.witness.state import WitnessState
from ledger.witness.submit import SizeConflict, add_checkpoint, cosign_checkpoint, request_body

ORIGIN = "log.example/r29"
LOG = SignerKey.generate("log.example/r29")
WITNESS = WitnessSigner.generate("witness.example/w1")
LEAVES = [merkle.leaf_hash(b"leaf %d" % i) for i in range(32)]
FORGED = [merkle.leaf_hash(b"forged %d" % i) for i in range(32)]
URL = "http://testserver"


def _note(size: int, leaves: list[bytes] = LEAVES, origin: str = ORIGIN) -> str:
    return LOG.sign(Checkpoint(origin, size, merkle.root(leaves[:size])).text())


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    now = iter(range(1000, 2000))
    witness = Witness(
        WitnessState(tmp_path / "w.db"), WITNESS, {ORIGIN: [LOG.verifier]}, lambda: next(now)
    )
    with TestClient(create_app(witness)) as test_client:
        yield test_client


def _post(client: TestClient, body: bytes) -> httpx.Response:
    answer: httpx.Response = client.post("/add-checkpoint", content=body)
    return answer


def test_r29_200_is_the_cosignature_line(client: TestClient) -> None:
    answer = _post(client, request_body(_note(5), 0, []))
    assert answer.status_code == 200
    assert answer.text.endswith("\n") and answer.text.count("\n") == 1
    cosigned = _note(5) + answer.text
    assert verify_cosignatures(cosigned, [WITNESS.verifier]) == {WITNESS.verifier: 1000}


def test_r29_409_names_the_known_size_as_text_x_tlog_size(client: TestClient) -> None:
    _post(client, request_body(_note(5), 0, []))
    answer = _post(client, request_body(_note(9), 0, []))
    assert answer.status_code == 409
    assert answer.headers["content-type"] == "text/x.tlog.size"
    assert answer.text == "5\n"


@pytest.mark.parametrize(
    "body",
    [
        b"old 0\n" + _note(3).encode(),  # no blank line after the proof lines
        b"old 00\n\n" + _note(3).encode(),  # leading zero
        b"old -1\n\n" + _note(3).encode(),
        b"old 0\nnot-base64\n\n" + _note(3).encode(),
        b"old 0\n" + base64.b64encode(b"short") + b"\n\n" + _note(3).encode(),
        b"old 0\n"
        + b"".join(base64.b64encode(bytes(32)) + b"\n" for _ in range(64))
        + b"\n"
        + _note(3).encode(),  # 64 proof lines: at most 63
        b"old 0\n\n" + _note(3).replace("\n3\n", "\n03\n").encode(),  # size with a leading zero
        b"old 0\n\nnot a checkpoint\n\n- x y\n",
        b"old 0\n\n" + _note(3).encode()[:-1],  # the note's last line without its newline
        b"old 4\n\n" + _note(3).encode(),  # old larger than the checkpoint's size
        b"\xff\xfe",
    ],
)
def test_r29_400_malformed(client: TestClient, body: bytes) -> None:
    assert _post(client, body).status_code == 400


def test_r29_404_unknown_origin(client: TestClient) -> None:
    answer = _post(client, request_body(_note(3, origin="other.example/log"), 0, []))
    assert answer.status_code == 404


def test_r29_403_without_a_valid_log_signature(client: TestClient) -> None:
    stranger = SignerKey.generate(LOG.name)  # same name, another key: ignored
    unsigned = stranger.sign(Checkpoint(ORIGIN, 3, merkle.root(LEAVES[:3])).text())
    assert _post(client, request_body(unsigned, 0, [])).status_code == 403
    forged = _note(3).replace(base64.b64encode(merkle.root(LEAVES[:3])).decode(), "A" * 43 + "=")
    assert _post(client, request_body(forged, 0, [])).status_code == 403


def test_r29_422_inconsistent_and_kept(client: TestClient, tmp_path: Path) -> None:
    _post(client, request_body(_note(8), 0, []))
    same_size = _post(client, request_body(_note(8, FORGED), 8, []))
    larger = _post(
        client, request_body(_note(12, FORGED), 8, merkle.consistency_proof(FORGED, 8, 12))
    )
    nonempty_from_zero = request_body(_note(8), 0, [LEAVES[0]])
    assert (same_size.status_code, larger.status_code) == (422, 422)
    assert _post(client, nonempty_from_zero).status_code == 409  # old 0 is not the known 8
    reasons = [e["reason"] for e in WitnessState(tmp_path / "w.db").evidence()]
    assert reasons == ["root_mismatch", "inconsistent_tree"]


def test_r29_monitoring_checkpoint_and_routes(client: TestClient) -> None:
    origin_hash = hashlib.sha256(ORIGIN.encode()).hexdigest()
    assert client.get(f"/{origin_hash}/checkpoint").status_code == 404
    _post(client, request_body(_note(4), 0, []))
    kept = client.get(f"/{origin_hash}/checkpoint")
    assert kept.status_code == 200
    assert Checkpoint.parse(kept.text).size == 4
    assert verify_cosignatures(kept.text, [WITNESS.verifier]) == {WITNESS.verifier: 1000}
    assert client.get("/add-checkpoint").status_code == 405
    assert client.post("/add-checkpoint", content=b"x" * (MAX_BODY + 1)).status_code == 413


# --------------------------------------------------------------------------- the submit client


def test_r29_submit_client_maps_every_answer(client: TestClient) -> None:
    key = WITNESS.verifier
    lines = add_checkpoint(URL, _note(5), 0, [], key=key, client=client)
    assert verify_cosignatures(_note(5) + lines[0] + "\n", [key]) == {key: 1000}
    with pytest.raises(SizeConflict) as conflict:
        add_checkpoint(URL, _note(9), 0, [], client=client)
    assert conflict.value.known_size == 5
    assert conflict.value.exit_code == 4  # a domain Conflict
    # cosign_checkpoint retries from the size the 409 names, with a proof from it.
    lines = cosign_checkpoint(
        URL, _note(9), lambda old: merkle.consistency_proof(LEAVES, old, 9), key=key, client=client
    )
    assert len(lines) == 1
    with pytest.raises(SizeConflict):  # behind what the witness cosigned: no proof exists
        cosign_checkpoint(URL, _note(7), lambda old: [], key=key, client=client)
    with pytest.raises(IntegrityFailure) as refused:
        add_checkpoint(URL, _note(9, FORGED), 9, [], client=client)
    assert refused.value.details["reason"] == "witness_refused"
    assert refused.value.details["status"] == 422
    with pytest.raises(IntegrityFailure) as refused:
        add_checkpoint(URL, _note(3, origin="other.example/log"), 0, [], client=client)
    assert refused.value.details["status"] == 404
    other = WitnessSigner.generate("witness.example/w1").verifier  # not this witness's key
    with pytest.raises(IntegrityFailure) as refused:
        add_checkpoint(URL, _note(9), 9, [], key=other, client=client)
    assert refused.value.details["reason"] == "bad_cosignature"


def test_r29_submit_client_unavailable_on_5xx_and_no_answer() -> None:
    failing = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    with pytest.raises(Unavailable) as caught:
        add_checkpoint(URL, _note(3), 0, [], client=failing)
    assert caught.value.details["status"] == 503

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    down = httpx.Client(transport=httpx.MockTransport(refuse))
    with pytest.raises(Unavailable):
        add_checkpoint(URL, _note(3), 0, [], client=down)
