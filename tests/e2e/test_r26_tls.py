"""R26 over TLS: ``serve`` serves HTTPS, and a client certificate signed by the client CA
authenticates as the one audience its SAN URI names, in place of a token.

The tests make their own CA and certificates with ``cryptography``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given
from hypothesis import strategies as st

from domain.credentials import audience_uri, parse_audience_uri
from domain.errors import InvalidInput
from domain.identity import identity_problem
from ledger.http.tls import TlsH11Protocol
from tests.support.cli_inprocess import cli_json
from tests.support.cli_support import ServedStore
from tests.support.gitrepo import push_closure
from tests.support.lifecycle_support import World

MISSING = b'{"error":"MISSING","message":"no catalog view is published for this audience",'
MISSING += b'"details":{}}'
#: An audience whose id needs percent-encoding in a URI (space, slash, non-ASCII).
ODD = ("integration", "erp sync/Zürich")
NOW = dt.datetime.now(dt.UTC)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


@dataclass
class Authority:
    """A CA: its key and certificate, and what it issues."""

    folder: Path
    name: str
    key: ec.EllipticCurvePrivateKey = field(init=False)
    cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        public = self.key.public_key()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(self.name))
            .issuer_name(_name(self.name))
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=1))
            .not_valid_after(NOW + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.cert_file = self.folder / f"{self.name}.pem"
        self.cert_file.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        san: list[x509.GeneralName],
        usage: x509.ObjectIdentifier,
        *,
        expired: bool = False,
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        after = NOW - dt.timedelta(hours=1) if expired else NOW + dt.timedelta(days=7)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(days=2))
            .not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_file, key_file = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_file, key_file

    def server(self) -> tuple[Path, Path]:
        san: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        return self.issue("server", san, ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, name: str, *uris: str, expired: bool = False) -> tuple[Path, Path]:
        san: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
        return self.issue(name, san, ExtendedKeyUsageOID.CLIENT_AUTH, expired=expired)


def client(base: str, server_ca: Path, cert: tuple[Path, Path] | None = None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(server_ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(base_url=base, verify=context, timeout=30)


def view_path(kind: str, ident: str) -> str:
    from urllib.parse import quote

    return f"/v1/audiences/{kind}/{quote(ident, safe='')}/view"


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Authority]:
    folder = tmp_path / "pki"
    folder.mkdir()
    return {"server": Authority(folder, "server-ca"), "clients": Authority(folder, "client-ca")}


def _publish(world: World) -> dict[str, str]:
    audiences = ["app:crm", "integration:erp-sync", f"{ODD[0]}:{ODD[1]}"]
    bindings = [b for a in audiences for b in push_closure(a, "sales")]
    world.service.apply(
        world.manifest([world.official("sales", world.commit("sales", 1))], bindings)
    )
    return {a: world.service.credentials_issue(a)["token"] for a in audiences}


def test_r26_serve_over_tls_with_client_certificates_in_place_of_tokens(
    world: World, pki: dict[str, Authority]
) -> None:
    tokens = _publish(world)
    server_ca, clients = pki["server"], pki["clients"]
    cert, key = server_ca.server()
    server = ServedStore(
        world.url,
        auth=True,
        https_ca=server_ca.cert_file,
        serve_options=(
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-client-ca",
            str(clients.cert_file),
        ),
    )
    crm = clients.client("crm", audience_uri("app", "crm"))
    odd = clients.client("odd", audience_uri(*ODD))
    try:
        base = server.base
        assert base.startswith("https://")
        # A certificate alone authenticates as its audience, and reads that one only.
        with client(base, server_ca.cert_file, crm) as c:
            own = c.get(view_path("app", "crm"))
            assert own.status_code == 200 and own.json()["audience"] == "app:crm"
            other = c.get(view_path("integration", "erp-sync"))
            unknown = c.get(view_path("app", "never-seen"))
            assert [(r.status_code, r.content) for r in (other, unknown)] == [(404, MISSING)] * 2
            assert c.get("/v1/catalog/head").status_code == 200
            # With a token too: both must name the same audience.
            both = c.get(view_path("app", "crm"), headers=_bearer(tokens["app:crm"]))
            assert both.status_code == 200
            clash = c.get(view_path("app", "crm"), headers=_bearer(tokens["integration:erp-sync"]))
            assert (clash.status_code, clash.json()["details"]) == (401, {"reason": "certificate"})
            assert clash.headers["www-authenticate"].startswith("Bearer")
        # The id is percent-encoded in the URI (RFC 3986) and decoded exactly.
        with client(base, server_ca.cert_file, odd) as c:
            read = c.get(view_path(*ODD))
            assert read.status_code == 200 and read.json()["audience"] == f"{ODD[0]}:{ODD[1]}"
        # No certificate: tokens work as without TLS; nothing at all is 401.
        with client(base, server_ca.cert_file) as c:
            assert c.get(
                view_path("app", "crm"), headers=_bearer(tokens["app:crm"])
            ).status_code == (200)
            assert c.get(view_path("app", "crm")).status_code == 401
            assert c.get("/healthz").status_code == 200
        # A certificate naming several audiences, none, or a malformed one is refused.
        for name, uris in (
            ("several", (audience_uri("app", "crm"), audience_uri("integration", "erp-sync"))),
            ("none", ("https://example.com/crm",)),
            ("bare", ()),
            ("malformed", ("catalog-ledger:audience:app:%zz",)),
            ("bad-kind", ("catalog-ledger:audience:workload:crm",)),
        ):
            with client(base, server_ca.cert_file, clients.client(name, *uris)) as c:
                refused = c.get(view_path("app", "crm"), headers=_bearer(tokens["app:crm"]))
                assert refused.status_code == 401, name
                assert refused.json()["details"] == {"reason": "certificate"}, name
        # Not signed by the client CA, or expired: the handshake itself refuses it.
        stranger = Authority(server_ca.folder, "stranger-ca").client(
            "stranger", audience_uri("app", "crm")
        )
        expired = clients.client("expired", audience_uri("app", "crm"), expired=True)
        for refused_cert in (stranger, expired):
            with (
                client(base, server_ca.cert_file, refused_cert) as c,
                pytest.raises(httpx.TransportError),
            ):
                c.get(view_path("app", "crm"))
        # Plain HTTP on the HTTPS port gets no view.
        with pytest.raises(httpx.TransportError):
            httpx.get(base.replace("https://", "http://") + view_path("app", "crm"), timeout=10)
    finally:
        server.close()
    for token in tokens.values():
        assert token not in server.stderr


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_r26_serve_tls_serves_https_with_tokens_and_no_client_ca(
    world: World, pki: dict[str, Authority]
) -> None:
    tokens = _publish(world)
    cert, key = pki["server"].server()
    server = ServedStore(
        world.url,
        auth=True,
        https_ca=pki["server"].cert_file,
        serve_options=("--tls-cert", str(cert), "--tls-key", str(key)),
    )
    try:
        assert server.view("app:crm", token=tokens["app:crm"]).status_code == 200
        assert server.view("app:crm").status_code == 401
        # A client certificate is not asked for, and one that is sent counts for nothing.
        crm = pki["clients"].client("crm", audience_uri("app", "crm"))
        with client(server.base, pki["server"].cert_file, crm) as c:
            assert c.get(view_path("app", "crm")).status_code == 401
    finally:
        server.close()


def test_r26_serve_tls_options_are_checked_before_anything_listens(
    world: World, pki: dict[str, Authority], monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    cert, key = pki["server"].server()
    _, other_key = pki["server"].issue("other", [], ExtendedKeyUsageOID.SERVER_AUTH)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    serve = ("--db", world.url, "serve", "--port", "0")
    code, listening = cli_json(
        *serve,
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
        "--tls-client-ca",
        str(pki["clients"].cert_file),
    )
    assert code == 0 and listening["url"] == "https://127.0.0.1:0", listening
    assert listening["auth"] == "bearer+client-certificate"
    (kwargs,) = calls
    assert (kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (str(cert), str(key))
    assert kwargs["ssl_ca_certs"] == str(pki["clients"].cert_file)
    assert kwargs["ssl_cert_reqs"] == ssl.CERT_OPTIONAL and kwargs["http"] is TlsH11Protocol
    garbage = world.tmp / "garbage.pem"
    garbage.write_text("not a certificate\n", encoding="utf-8")
    for args, expected in (
        (("--tls-cert", str(cert)), (2, "USAGE", None)),
        (("--tls-key", str(key)), (2, "USAGE", None)),
        (("--tls-client-ca", str(pki["clients"].cert_file)), (2, "USAGE", None)),
        (("--tls-cert", str(garbage), "--tls-key", str(key)), (3, "INVALID", "tls_cert")),
        (("--tls-cert", str(cert), "--tls-key", str(garbage)), (3, "INVALID", "tls_key")),
        (("--tls-cert", str(cert), "--tls-key", str(other_key)), (3, "INVALID", "tls_key")),
        (("--tls-cert", str(cert), "--tls-key", str(cert)), (3, "INVALID", "tls_key")),
        (
            ("--tls-cert", str(cert), "--tls-key", str(world.tmp / "absent.key")),
            (3, "INVALID", "tls_key"),
        ),
        (
            ("--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(garbage)),
            (3, "INVALID", "tls_client_ca"),
        ),
        (
            ("--tls-cert", str(world.tmp / "absent.pem"), "--tls-key", str(key)),
            (3, "INVALID", "tls_cert"),
        ),
    ):
        code, error = cli_json(*serve, *args)
        assert (code, error["error"], error["details"].get("field")) == expected, args
    assert len(calls) == 1  # none of the refused ones listened
    code, error = cli_json(*serve, "--tls-cert", str(cert), "--tls-key", str(other_key))
    assert f"--tls-key {other_key} is not the private key of --tls-cert {cert}" in error["message"]


_IDENTITIES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40).filter(
    lambda s: identity_problem(s) is None
)


@given(kind=st.sampled_from(["app", "integration"]), ident=_IDENTITIES)
def test_r26_audience_uris_percent_encode_every_identity_and_decode_it_exactly(
    kind: str, ident: str
) -> None:
    uri = audience_uri(kind, ident)
    assert uri.isascii() and " " not in uri
    assert parse_audience_uri(uri) == (kind, ident)
    # Lowercase hex digits decode alike (RFC 3986 section 2.1).
    lowered = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), uri)
    assert parse_audience_uri(lowered) == (kind, ident)


@pytest.mark.parametrize(
    "uri",
    [
        "catalog-ledger:audience:app",
        "catalog-ledger:audience:app:%",
        "catalog-ledger:audience:app:%4",
        "catalog-ledger:audience:app:%zz",
        "catalog-ledger:audience:app:%C3",  # not UTF-8 once decoded
        "catalog-ledger:audience:app:a b",  # a space must be encoded
        "catalog-ledger:audience:app:é",  # so must non-ASCII
        "urn:other:app:crm",
    ],
)
def test_r26_malformed_audience_uris_are_refused_naming_the_certificate(uri: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_audience_uri(uri)
    assert info.value.field == "certificate"
