"""TLS for ``serve`` and client certificates as credentials (mTLS, R26).

``serve --tls-cert FILE --tls-key FILE`` serves HTTPS; ``--tls-client-ca FILE``
asks every client for a certificate (optional: bearer tokens keep working)
and the TLS handshake refuses any certificate that this CA did not sign or
that is expired or otherwise invalid. A certificate that passes names its
audience by one SAN URI ``catalog-ledger:audience:<kind>:<id>`` (the id
percent-encoded, RFC 3986) and authenticates as that audience in place of a
token (``ledger.http.auth``).

The server stack: uvicorn does not yet hand the client certificate to the app
(the ASGI TLS extension is unreleased there), so ``TlsH11Protocol`` — a small
subclass of uvicorn's h11 protocol, used only with ``--tls-client-ca`` — puts
the verified peer certificate of each connection into every request's scope
as the ASGI TLS extension (``scope["extensions"]["tls"]["client_cert_chain"]``,
PEM, leaf first), where the authentication dependency reads it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from domain.errors import InvalidInput
from ledger.http.protocol import NoDelayH11Protocol


class TlsH11Protocol(NoDelayH11Protocol):
    """uvicorn's h11 protocol, plus the ASGI TLS extension with the client certificate."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        # Only the key this service reads; the extension's other keys are not filled in.
        tls: dict[str, Any] = {
            "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        }
        inner = self.app

        async def with_tls(scope: Any, receive: Any, send: Any) -> None:
            if scope.get("type") in ("http", "websocket"):
                scope.setdefault("extensions", {})["tls"] = tls
            await inner(scope, receive, send)

        self.app = with_tls


def client_certificate(scope: Mapping[str, Any]) -> str | None:
    """The verified client certificate (PEM) of the request's connection, if any."""
    chain = scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or []
    return str(chain[0]) if chain else None


def san_uris(pem: str) -> list[str]:
    """Every SAN URI of a certificate (none if it has no SAN extension)."""
    cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return [str(u) for u in san.value.get_values_for_type(x509.UniformResourceIdentifier)]


def _read(path: Path, option: str, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read {option} {path}: {exc.strerror or exc}", field=field
        ) from None


def _check_pair(cert: Path, key: Path) -> None:
    """INVALID naming the file at fault: ``tls_cert`` for a certificate that cannot be
    read or parsed, ``tls_key`` for a key that cannot, or that is not the key of the
    certificate (OpenSSL's one "cannot load" error would name neither)."""
    try:
        chain = x509.load_pem_x509_certificates(_read(cert, "--tls-cert", "tls_cert"))
    except ValueError as exc:
        raise InvalidInput(
            f"--tls-cert {cert} is not a PEM certificate: {exc}", field="tls_cert"
        ) from None
    try:
        private = serialization.load_pem_private_key(
            _read(key, "--tls-key", "tls_key"), password=None
        )
    except TypeError:
        raise InvalidInput(
            f"--tls-key {key} is encrypted: give an unencrypted PEM key", field="tls_key"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InvalidInput(
            f"--tls-key {key} is not a PEM private key: {exc}", field="tls_key"
        ) from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if private.public_key().public_bytes(der, spki) != chain[0].public_key().public_bytes(
        der, spki
    ):
        raise InvalidInput(
            f"--tls-key {key} is not the private key of --tls-cert {cert} "
            "(their public keys differ)",
            field="tls_key",
        )


def server_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """Load the files ``serve`` was given now, so a bad one is INVALID naming its option
    before anything listens (uvicorn loads them again, the same way)."""
    _check_pair(cert, key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInput(
            f"cannot use --tls-cert {cert} with --tls-key {key}: {exc}", field="tls_cert"
        ) from None
    if client_ca is not None:
        try:
            context.load_verify_locations(client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(
                f"cannot use --tls-client-ca {client_ca}: {exc}", field="tls_client_ca"
            ) from None
    return context
