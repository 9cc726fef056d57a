"""In-process stand-ins for tlog-witnesses, for the collector's unit logic only (R29).

The end-to-end tests run real witness processes (``catalog-ledger witness serve``); these
fakes answer ``add_checkpoint(url, note, old_size, proof)`` as C2SP tlog-witness does:
409 (``Conflict`` with ``known_size``, as ``ledger.witness.submit`` raises it) when
``old_size`` is not the size they last cosigned, a consistency proof checked from it,
and one ``cosignature/v1`` line (C2SP tlog-cosignature: key id with type byte 0x04,
8-byte big-endian timestamp, Ed25519 over ``cosignature/v1\\ntime T\\n`` and the
checkpoint body).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from domain import merkle
from domain.errors import Conflict, Unavailable
from domain.notes import Checkpoint, SignerKey


class FakeWitness:
    def __init__(self, name: str, clock: Callable[[], int]) -> None:
        self.name = name
        self.url = f"http://{name}.invalid"
        self.private = Ed25519PrivateKey.generate()
        self.public = self.private.public_key().public_bytes_raw()
        self.clock = clock
        #: The catalog log's tree (an origin ending ``/catalog``); ``others``: any other
        #: log's (the main log's, which the collector submits too).
        self.size = 0
        self.root = merkle.EMPTY_ROOT
        self.others: dict[str, tuple[int, bytes]] = {}
        self.down = False
        #: Origins this witness does not answer for (down for those logs only).
        self.down_for: set[str] = set()
        #: ``old`` of each catalog-log submission; ``other_calls``: of the others.
        self.calls: list[int] = []
        self.other_calls: list[int] = []

    @property
    def key_id(self) -> bytes:
        return hashlib.sha256(self.name.encode() + b"\n\x04" + self.public).digest()[:4]

    def key(self) -> str:
        body = base64.b64encode(b"\x04" + self.public).decode()
        return f"{self.name}+{self.key_id.hex()}+{body}"

    def add(self, old: int, proof: Sequence[bytes], note: str) -> list[str]:
        cp = Checkpoint.parse(note)
        catalog = cp.origin.endswith("/catalog")
        (self.calls if catalog else self.other_calls).append(old)
        if self.down or cp.origin in self.down_for:
            raise Unavailable(f"{self.name} does not answer")
        size, root = (
            (self.size, self.root)
            if catalog
            else self.others.get(cp.origin, (0, merkle.EMPTY_ROOT))
        )
        if old != size:
            raise Conflict(f"{self.name} knows size {size}", known_size=size)
        if 0 < old < cp.size:
            merkle.verify_consistency(old, cp.size, list(proof), root, cp.root)
        if catalog:
            self.size, self.root = cp.size, cp.root
        else:
            self.others[cp.origin] = (cp.size, cp.root)
        body = note.split("\n\n", 1)[0] + "\n"
        ts = self.clock()
        signature = self.private.sign(f"cosignature/v1\ntime {ts}\n{body}".encode())
        raw = self.key_id + ts.to_bytes(8, "big") + signature
        return [f"\u2014 {self.name} {base64.b64encode(raw).decode()}"]


class Witnesses:
    """Three fakes and the ``add_checkpoint`` that reaches them by URL."""

    def __init__(self, now: list[int]) -> None:
        self.now = now
        self.all = [FakeWitness(f"w{n}", lambda: self.now[0]) for n in range(3)]

    def clock(self) -> float:
        """The collector's clock in the witnesses' time (they cosign at ``now``)."""
        return float(self.now[0])

    def add_checkpoint(self, url: str, note: str, old: int, proof: Sequence[bytes]) -> list[str]:
        (witness,) = [w for w in self.all if w.url == url]
        return witness.add(old, proof, note)

    def policy(self, path: Path, origin: str, signer: SignerKey, threshold: int = 2) -> Path:
        path.write_text(
            json.dumps(
                {
                    "origin": origin,
                    "log_keys": [signer.verifier.text()],
                    "witnesses": [{"key": w.key(), "url": w.url} for w in self.all],
                    "threshold": threshold,
                    "max_age_seconds": 3600,
                }
            ),
            encoding="utf-8",
        )
        return path
