"""R29: signed notes, checkpoints and cosignatures byte for byte as the C2SP specs write
them (C2SP/C2SP at 5ba5ee8: signed-note.md, tlog-checkpoint.md, tlog-cosignature.md,
tlog-witness.md), checked against the examples the specs publish, and against a real
cosigned checkpoint of a public log so that a standard witness's cosignature verifies
with our code.

The spec examples with a key to verify against are signed-note's "Example" (vkey
``example.com/foo+530d903a``); the others (tlog-checkpoint's and tlog-cosignature's
``example.com/behind-the-sofa`` checkpoint, tlog-witness's request and response
bodies) come without keys: they pin the formats (the parsed fields, the signed
message, the body we build) rather than a signature.
"""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from domain.errors import IntegrityFailure, InvalidInput
from domain.notes import (
    Checkpoint,
    NoteSignature,
    SignedNote,
    SignerKey,
    VerifierKey,
    WitnessKey,
    WitnessSigner,
    add_cosignatures,
    cosignature_key_id,
    cosignature_timestamp,
    cosigned_message,
    verify_cosignatures,
    verify_log_signatures,
)
from ledger.witness.protocol import parse_add_checkpoint
from ledger.witness.submit import request_body

# signed-note.md, "Verifier keys" / "Example".
SIGNED_NOTE_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SIGNED_NOTE_EXAMPLE = (
    "This is an example message.\n"
    "\n"
    "— example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3m"
    "FXmRKuwHjG1Yu72IneyaQM=\n"
)
# signed-note.md, the opening example: a text with a blank line of its own.
QUASIMODO = (
    "Ognuno sta solo sul cuor della terra\n"
    "trafitto da un raggio di sole:\n"
    "\n"
    "ed è subito sera.\n"
    "\n"
    "— quasimodo.example/salvatore NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+EhfLW9oJKONr"
    "MouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n"
)
# tlog-checkpoint.md and tlog-cosignature.md: the example checkpoint body.
SOFA_BODY = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SOFA_LOG_LINE = (
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5"
    "/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8="
)
# tlog-cosignature.md, "Below is an example of a checkpoint that contains a cosignature".
SOFA_COSIGNATURE_LINE = (
    "— witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlr"
    "DJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA=="
)
# tlog-cosignature.md, "Ed25519 signed message": the message for that cosignature.
SOFA_SIGNED_MESSAGE = b"cosignature/v1\ntime 1679315147\n" + SOFA_BODY.encode()
# tlog-witness.md, "add-checkpoint": the example request body.
WITNESS_REQUEST = (
    "old 20852014\n"
    "PlRNCrwHpqhGrupue0L7gxbjbMiKA9temvuZZDDpkaw=\n"
    "jrJZDmY8Y7SyJE0MWLpLozkIVMSMZcD5kvuKxPC3swk=\n"
    "5+pKlUdi2LeF/BcMHBn+Ku6yhPGNCswZZD1X/6QgPd8=\n"
    "/6WVhPs2CwSsb5rYBH5cjHV/wSmA79abXAwhXw3Kj/0=\n"
    "\n"
    "example.com/behind-the-sofa\n"
    "20852163\n"
    "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
    "\n"
    "— example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5"
    "/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
    "— example.com/behind-the-sofa opLqBQsREYCgu6xQkYQwJr9fo45a62DN9EdmHXnZdXNqlcVGlCum2Wks"
    "+49/V6267UEjw6QUXTS5Rovnzv++qbSzm9Q=\n"
)
# tlog-witness.md, "add-checkpoint": the example response body.
WITNESS_RESPONSE = (
    "— witness.example/w1 CMp+6LWBU0anHGH5aNDTJkH/gj79sG+T6+iP2ThYN5krrDJbR1HDnucjL39QsZTSvV"
    "jyQLrdk3DXDqI5G2HgLatVs0pWh6Up69HVOw==\n"
    "— witness.example/w1 I7rEps0pvK2UqkS2gSpVUDhrhVtQV9lgF6pRrWAvjJHjyWpW7VcE3SiOlVlbQNt64v"
    "WhO+DlkL0+UfzuOBMh9ChdMkP1vi/lCAsmlw==\n"
    "— witness.example/w2 AWui8Sk55XjYLOijihBjhqEH6nS1ndDymE0a+6idX7pLcnoB+dhnz0854aLZgrrKbY"
    "KA7nC3HNJhm/kWl7oJlqU3rXXvpysAdyP3wQ==\n"
)

# A real checkpoint of the public log arche2025h1.staging.ct.transparency.dev, with its
# Ed25519 signature (type 0x01), its RFC 6962 STH signature (type 0x05, same key name)
# and cosignatures by public witnesses; among them remora.n621.de, whose cosignature/v1
# vkey (type 0x04) is a row of transparency-dev/formats note_cosigv1_test.go
# (TestCoSigV1NewVerifier). Note and keys as florolf/tlog-scales's tests pin them.
ARCHE = (
    "arche2025h1.staging.ct.transparency.dev\n"
    "1432088532\n"
    "U7WM79jrzyhGZ5/GUBTpM7NzwdyfFx61t3RovgcC4Ro=\n"
    "\n"
    "— arche2025h1.staging.ct.transparency.dev zTM8sQAAAZ5W0WdjBAMARjBEAiBjW5IQf9pvsYLfQFX6h"
    "oGREPMHbdQ3urbllzalApkptQIgIpwtEroeW2BXaHAI4kJXFbon5Ch9MNL5zRNZ55lvGt0=\n"
    "— arche2025h1.staging.ct.transparency.dev ui8GwCF1+kWqZrxGdhj4aX3gcw7XUlXQQabg/27lefwhU"
    "kzbC3NygNI75MdhL1bfTW9g8Ei59RA23oHP7Ry1k3ZFWwQ=\n"
    "— transparency.dev/DEV:witness-little-garden 2AQqhwAAAABqEiEgzgFIqqhbUoDwjMWE6UP8nd8/KY"
    "TzwZ2rhIgcqoXHAwVkjZr4AscylP3v7sEodkRAErumC2q44vdgJY096st5BQ==\n"
    "— witness1.smartit.nu/witness1 pIyCDwAAAABqEiEghIp82KWebrw7/oHQwlTAm3g2RKS4+eebl8eO0WH+"
    "/iEcxZ75W3u5hNI7TOQtmJbqmNWVuE0tgh0XwzdZsDsUAQ==\n"
    "— remora.n621.de 2net5wAAAABqEiEgPlfF3V06o0Y+fHM+J5J9s27wgxxcOVSpZ/2g/KSiXCg9DEZI+aVCIo"
    "bWX9sXTynk5XeU/zZ0WBxtqB0DrAWfBw==\n"
    "— witness.stagemole.eu Z/euoAAAAABqEiEgw0i+7g2ENfDAWHmtRzCfKTHSDwYDJA2NmKeGi9Y8FtEyOUvV"
    "r+AJmIY/2TUFucgKi7lI7cUiOvKFYe/TmN9DAg==\n"
)
ARCHE_LOG_VKEY = (
    "arche2025h1.staging.ct.transparency.dev+ba2f06c0+AU0vHmlGCS/PdN8b2OaGmKprLI8HKM+dJ472xgFYh15f"
)
REMORA_VKEY = "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2"


# --------------------------------------------------------------------------- signed-note


def test_r29_signed_note_example_verifies_with_its_vkey() -> None:
    """signed-note.md "Example": example.com/foo+530d903a verifies the example note;
    the note text is the line with its newline, the key id the first four bytes."""
    key = VerifierKey.parse(SIGNED_NOTE_VKEY)
    assert key.public.hex() == "e932791ae6e7a840a46164c904786426d5e7821dd8b29a00d61cae72afdd4da4"
    assert key.text() == SIGNED_NOTE_VKEY
    note = SignedNote.parse(SIGNED_NOTE_EXAMPLE)
    assert note.text == "This is an example message.\n"
    [signature] = note.signatures
    assert (signature.name, signature.key_id.hex()) == ("example.com/foo", "530d903a")
    public = Ed25519PublicKey.from_public_bytes(key.public)
    public.verify(signature.signature, note.text.encode())  # raises if not
    assert note.render() == SIGNED_NOTE_EXAMPLE


def test_r29_signed_note_text_ends_at_the_last_blank_line() -> None:
    """signed-note.md's opening example (quasimodo.example/salvatore): the text has a
    blank line of its own; the signatures start after the *last* one."""
    note = SignedNote.parse(QUASIMODO)
    assert note.text.endswith("sole:\n\ned è subito sera.\n")
    assert [s.name for s in note.signatures] == ["quasimodo.example/salvatore"]
    assert note.render() == QUASIMODO


@pytest.mark.parametrize(
    "text",
    [
        "no signatures\n",
        "text\n\n",  # a blank line and no signature line
        "text\n\n— name c2lnbmF0dXJl",  # no final newline
        "text\n\n- name c2lnbmF0dXJl\n",  # a hyphen, not U+2014
        "text\n\n— na+me c2lnbmF0dXJl\n",  # '+' in a key name
        "text\n\n— name not*base64\n",
        "text\n\n— name AAAA\n",  # shorter than a key id and one byte
        "te\x01xt\n\n— name c2lnbmF0dXJl\n",  # a control character
    ],
)
def test_r29_malformed_signed_notes_are_invalid(text: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        SignedNote.parse(text, field="checkpoint")
    assert caught.value.field == "checkpoint"


# --------------------------------------------------------------------------- tlog-checkpoint


def test_r29_checkpoint_example_parses() -> None:
    """tlog-checkpoint.md's example: origin, size, base64 root; the log's line by key id
    033de0ae (the spec gives no key for it)."""
    note = SignedNote.parse(SOFA_BODY + "\n" + SOFA_LOG_LINE + "\n")
    checkpoint = Checkpoint.parse(note.text)
    assert (checkpoint.origin, checkpoint.size) == ("example.com/behind-the-sofa", 20852163)
    assert checkpoint.text() == SOFA_BODY
    assert note.signatures[0].key_id.hex() == "033de0ae"


@pytest.mark.parametrize("size", ["03", "00", "0020852163"])
def test_r29_a_checkpoint_size_with_leading_zeroes_is_refused(size: str) -> None:
    """tlog-checkpoint: the size is "ASCII decimal, with no leading zeroes" — so one tree
    has one body, and one signature cannot be replayed under another spelling."""
    root = SOFA_BODY.split("\n")[2]
    with pytest.raises(InvalidInput):
        Checkpoint.parse(f"example.com/behind-the-sofa\n{size}\n{root}\n")
    assert Checkpoint.parse(f"example.com/x\n0\n{root}\n").size == 0


# --------------------------------------------------------------------------- tlog-cosignature


def test_r29_cosignature_example_carries_the_spec_timestamp() -> None:
    """tlog-cosignature.md: the example cosignature line by witness.example.com/w1 is key
    id || u64 timestamp || 64-byte signature, and its timestamp is 1679315147, the one of
    the spec's "Ed25519 signed message" example."""
    signature = NoteSignature.parse_line(SOFA_COSIGNATURE_LINE)
    assert len(signature.key_id + signature.signature) == 4 + 8 + 64
    assert cosignature_timestamp(signature) == 1679315147


def test_r29_cosigned_message_is_the_spec_example_byte_for_byte() -> None:
    """tlog-cosignature.md "Ed25519 signed message": ``cosignature/v1``, ``time
    1679315147``, then the checkpoint body with its final newline."""
    assert cosigned_message(SOFA_BODY, 1679315147) == SOFA_SIGNED_MESSAGE


def test_r29_our_cosignature_has_the_spec_layout_and_key_id() -> None:
    """A line we sign: key id SHA-256(name || "\\n" || 0x04 || pub)[:4], then the
    big-endian timestamp, then an Ed25519 signature of the signed message."""
    signer = WitnessSigner.generate("witness.example.com/w1")
    line = signer.cosign(SOFA_BODY, 1679315147)
    signature = NoteSignature.parse_line(line)
    public = signer.verifier.public
    wanted = hashlib.sha256(b"witness.example.com/w1\n\x04" + public).digest()[:4]
    assert signature.key_id == wanted == cosignature_key_id(signer.name, public)
    assert signature.signature[:8] == (1679315147).to_bytes(8, "big")
    Ed25519PublicKey.from_public_bytes(public).verify(signature.signature[8:], SOFA_SIGNED_MESSAGE)
    # the vkey: name, hex key id, base64(0x04 || public key) — and it reads back.
    vkey = signer.verifier.text()
    assert vkey.split("+", 2)[:2] == ["witness.example.com/w1", wanted.hex()]
    assert base64.b64decode(vkey.split("+", 2)[2])[:1] == b"\x04"
    assert WitnessKey.parse(vkey) == signer.verifier


def test_r29_transparency_dev_cosignature_timestamp_vector() -> None:
    """transparency-dev/formats note_cosigv1_test.go TestCoSigV1Timestamp "works"."""
    raw = (
        "ZGhGuQAAAABm/qTPeyKXD+R2rzyQsxPiP8mXum7qq/iF0u4vanlqJyocWODBt97w9uL+8qT7S5gxEHWWOwor"
        "DcFiEBYJXORmnFBOBA=="
    )
    signature = NoteSignature.parse_line(f"— any {raw}")
    assert cosignature_timestamp(signature) == 1727964367


def test_r29_a_public_witness_cosignature_verifies() -> None:
    """A standard witness's cosignature/v1 (remora.n621.de, on the public log
    arche2025h1.staging.ct.transparency.dev) verifies with our code; so does the log's
    Ed25519 signature, while its RFC 6962 line of the same name (another key id) and the
    cosignatures of witnesses we do not pin are ignored."""
    remora = WitnessKey.parse(REMORA_VKEY)
    assert remora.key_id.hex() == "da77ade7"
    assert verify_cosignatures(ARCHE, [remora]) == {remora: 1779573024}
    log = VerifierKey.parse(ARCHE_LOG_VKEY)
    checkpoint, valid = verify_log_signatures(ARCHE, [log])
    assert (checkpoint.size, valid) == (1432088532, [log])
    # The same lines on another size: the pinned witness's line no longer verifies.
    forged = ARCHE.replace("\n1432088532\n", "\n1432088533\n")
    with pytest.raises(IntegrityFailure) as caught:
        verify_cosignatures(forged, [remora])
    assert caught.value.details["reason"] == "bad_cosignature"
    with pytest.raises(IntegrityFailure) as caught:
        verify_log_signatures(forged, [log])
    assert caught.value.details["reason"] == "bad_signature"


def test_r29_only_pinned_witness_lines_count() -> None:
    """A line with a pinned name but another key id is someone else's (ignored); a line
    by the pinned key that does not verify is INTEGRITY bad_cosignature; two lines by
    one witness count once, with the newer timestamp."""
    a, b = WitnessSigner.generate("w.example/a"), WitnessSigner.generate("w.example/a")
    log = SignerKey.generate("log.example")
    note = log.sign(SOFA_BODY)
    assert verify_cosignatures(add_cosignatures(note, [b.cosign(SOFA_BODY, 5)]), [a.verifier]) == {}
    both = note + a.cosign(SOFA_BODY, 5) + "\n" + a.cosign(SOFA_BODY, 9) + "\n"
    assert verify_cosignatures(both, [a.verifier]) == {a.verifier: 9}
    other_body = SOFA_BODY.replace("20852163", "20852164")
    bad = add_cosignatures(note, [a.cosign(other_body, 5)])
    with pytest.raises(IntegrityFailure) as caught:
        verify_cosignatures(bad, [a.verifier])
    assert caught.value.details == {"reason": "bad_cosignature", "witness": "w.example/a"}


def test_r29_add_cosignatures_replaces_a_witness_older_line() -> None:
    signer = WitnessSigner.generate("w.example/a")
    note = SignerKey.generate("log.example").sign(SOFA_BODY)
    once = add_cosignatures(note, [signer.cosign(SOFA_BODY, 5)])
    twice = add_cosignatures(once, [signer.cosign(SOFA_BODY, 7) + "\n"])
    assert len(SignedNote.parse(twice).signatures) == 2
    assert verify_cosignatures(twice, [signer.verifier]) == {signer.verifier: 7}


def test_r29_witness_keys_in_both_note_forms() -> None:
    """The witness's private key reads in our type-0x04 form and in the type-0x01 form
    golang.org/x/mod/sumdb/note GenerateKey writes (transparency-dev's witness reads
    both); its verifier key is type 0x04 only (a log key is refused)."""
    signer = WitnessSigner.generate("w.example/a")
    assert WitnessSigner.parse(signer.text()) == signer
    as_log_key = SignerKey(signer.name, signer.seed).text()  # PRIVATE+KEY+…+base64(0x01||seed)
    assert WitnessSigner.parse(as_log_key) == signer
    with pytest.raises(InvalidInput, match="cosignature/v1"):
        WitnessKey.parse(SIGNED_NOTE_VKEY)
    tampered = signer.text().replace(signer.verifier.key_id.hex(), "00000000")
    with pytest.raises(InvalidInput, match="key id"):
        WitnessSigner.parse(tampered)


@pytest.mark.parametrize("timestamp", [0, -1, 2**63])
def test_r29_a_cosignature_timestamp_is_never_zero_nor_past_2_63(timestamp: int) -> None:
    """tlog-witness: the cosignature MUST NOT omit the timestamp; tlog-cosignature: it
    MUST NOT exceed 2^63 - 1."""
    with pytest.raises(InvalidInput) as caught:
        WitnessSigner.generate("w.example/a").cosign(SOFA_BODY, timestamp)
    assert caught.value.field == "timestamp"


def test_r29_log_signatures_bad_or_missing() -> None:
    log, other = SignerKey.generate("log.example"), SignerKey.generate("log.example")
    note = log.sign(SOFA_BODY)
    with pytest.raises(IntegrityFailure) as caught:
        verify_log_signatures(note, [other.verifier])
    assert caught.value.details["reason"] == "no_signature"
    broken = note.replace(SOFA_BODY, SOFA_BODY.replace("20852163", "1"))
    with pytest.raises(IntegrityFailure) as caught:
        verify_log_signatures(broken, [log.verifier])
    assert caught.value.details["reason"] == "bad_signature"
    # Either of two pinned keys (a rotation's overlap) is enough.
    assert verify_log_signatures(note, [other.verifier, log.verifier])[1] == [log.verifier]


# --------------------------------------------------------------------------- tlog-witness


def test_r29_witness_request_example_round_trips() -> None:
    """tlog-witness.md's example add-checkpoint body parses into old size 20852014, four
    proof hashes and the signed example checkpoint; the body our submit client builds
    from those is the example byte for byte."""
    request = parse_add_checkpoint(WITNESS_REQUEST.encode())
    assert request.old_size == 20852014
    assert len(request.proof) == 4
    assert request.checkpoint == Checkpoint.parse(SOFA_BODY)
    assert len(SignedNote.parse(request.note).signatures) == 2
    assert request_body(request.note, request.old_size, request.proof) == WITNESS_REQUEST.encode()


def test_r29_witness_response_example_is_signature_lines() -> None:
    """tlog-witness.md's example response: newline-terminated note signature lines
    (witness.example/w1 twice, w2), each a 4-byte key id and 72 bytes."""
    lines = WITNESS_RESPONSE.split("\n")
    assert lines[-1] == ""
    parsed = [NoteSignature.parse_line(line) for line in lines[:-1]]
    assert [s.name for s in parsed] == ["witness.example/w1"] * 2 + ["witness.example/w2"]
    assert {len(s.signature) for s in parsed} == {72}
