"""Read commands for runtimes: ``view`` and ``serve``."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import click
import orjson

from domain.errors import Unavailable, UsageError
from ledger.cli.app import cli, emit, json_option, log_settings, store
from ledger.http.settings import HEADER_TIMEOUT, KEEP_ALIVE_TIMEOUT, MAX_WAITERS, MULTIPROC_ENV
from ledger.observability import FORMAT_ENV, LEVEL_ENV, LEVELS, configure

#: Where ``serve --workers N`` tells its workers the store URL (``ledger.log.url.ENV_VAR``).
DB_ENV = "CATALOG_LEDGER_DB"


def is_loopback(host: str) -> bool:
    """``--no-auth`` may listen only here: 127.0.0.0/8, ::1 or the name localhost."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("127.0.0.0/8")
    return address == ipaddress.IPv6Address("::1")


@cli.command()
@click.argument("audience")
@click.option(
    "--min-revision",
    default=None,
    metavar="N",
    help="Fail with STALE unless the active revision is at least N.",
)
@click.option(
    "--at-revision",
    default=None,
    metavar="N",
    help="What the audience was served at revision N, replayed from the log alone.",
)
@json_option
def view(audience: str, min_revision: str | None, at_revision: str | None, as_json: bool) -> None:
    """Show what AUDIENCE (app:<id> or integration:<id>) is served, verified."""
    result = store().view(audience, min_revision=min_revision, at_revision=at_revision)
    if isinstance(result, dict):  # a past revision, replayed from the log
        past = result

        def human_past() -> None:
            click.echo(
                f"{past['audience']} at revision {past['revision']} (log position "
                f"{past['position']}, content {past['content_digest']})"
            )
            for fact in past["facts"]:
                click.echo(f"  {fact['pack']} {fact['kind']}/{fact['key']} [{fact['install_id']}]")

        emit(as_json, past, human_past)
        return
    live = result

    def human() -> None:
        click.echo(f"{live.audience} at revision {live.revision} (content {live.content_digest})")
        for fact in live.facts:
            click.echo(
                f"  {fact['pack']} {fact['kind']}/{fact['key']} "
                f"[{fact['install_id']}] {orjson.dumps(fact['payload']).decode()}"
            )

    emit(as_json, live.to_json(), human)


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets (RFC 3986), ``[::1]``,
    its zone's ``%`` encoded (RFC 6874, ``[fe80::1%25eth0]``)."""
    if ":" not in host or host.startswith("["):
        return host
    return "[" + host.replace("%", "%25") + "]"


def _port_is_free(host: str, port: int) -> None:
    """UNAVAILABLE (exit 1) now, naming the address, when nothing could listen there."""
    if port == 0:
        return
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Unavailable(
            f"cannot listen on {url_host(host)}:{port}: {exc}", host=host, port=port
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise Unavailable(
                f"cannot listen on {url_host(host)}:{port}: {exc.strerror or exc}",
                host=host,
                port=port,
            ) from None


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=64),
    default=1,
    show_default=True,
    help="Worker processes; /metrics then sums every worker's request counts "
    "(prometheus-client multiprocess mode).",
)
@click.option(
    "--log-level",
    "serve_log_level",
    type=click.Choice(LEVELS),
    default=None,
    help="Log level of the server (default: the global --log-level).",
)
@click.option(
    "--rebuild-stale",
    is_flag=True,
    help="Rebuild every view built by other view code than this program's before "
    "serving (otherwise such a view is not served and /healthz is 503, R25).",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="Development only: serve every audience without a credential. Refused unless "
    "--host is loopback (127.0.0.0/8, ::1 or localhost).",
)
@click.option(
    "--tls-cert",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Serve HTTPS with this certificate (PEM; with --tls-key).",
)
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The private key of --tls-cert (PEM).",
)
@click.option(
    "--tls-client-ca",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Accept client certificates signed by this CA (PEM) as credentials: SAN URI "
    "catalog-ledger:audience:<kind>:<id>, the id percent-encoded.",
)
@click.option(
    "--max-waiters",
    type=click.IntRange(min=0),
    default=MAX_WAITERS,
    show_default=True,
    help="Watches (`?wait=`) that may wait at once per worker; over it: 503 with Retry-After.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=None,
    help="Client connections open at once per worker (default: `ulimit -n` less a reserve "
    "for the store, 160 under `ulimit -n 256`). At the cap the connection that has waited "
    "longest for a request is closed for the new one.",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=HEADER_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="Time a request has to send its whole header block; then its connection is closed.",
)
@click.option(
    "--keep-alive-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=KEEP_ALIVE_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="Time an idle keep-alive connection stays open.",
)
@click.option(
    "--docs",
    is_flag=True,
    help="Serve a self-contained /docs page (no outside assets) beside /openapi.json.",
)
@json_option
def serve(
    host: str,
    port: int,
    workers: int,
    serve_log_level: str | None,
    rebuild_stale: bool,
    no_auth: bool,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    max_waiters: int,
    max_connections: int | None,
    header_timeout: float,
    keep_alive_timeout: float,
    docs: bool,
    as_json: bool,
) -> None:
    """Serve audience views over HTTP or HTTPS (read only): /v1/audiences/{kind}/{id}/view,
    /v1/catalog/head, /healthz and /metrics (Prometheus). Runtime reads need
    `Authorization: Bearer TOKEN` of a credential (`credentials issue`) or, with
    --tls-client-ca, a client certificate naming the audience (R26)."""
    import ssl
    import tempfile

    import uvicorn

    from ledger.http import limits
    from ledger.http.app import DOCS_ENV, MAX_WAITERS_ENV, NO_AUTH_ENV, create_app
    from ledger.http.protocol import NoDelayH11Protocol
    from ledger.http.tls import TlsH11Protocol, server_context

    if no_auth and not is_loopback(host):
        raise UsageError(
            f"--no-auth serves every audience to anyone who can connect: refused on --host "
            f"{host!r}; use a loopback address (127.0.0.0/8, ::1, localhost) or drop --no-auth"
        )
    if (tls_cert is None) != (tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if tls_client_ca is not None and tls_cert is None:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key (HTTPS)")
    # uvicorn settings: its h11 protocol with Nagle off (``ledger.http.protocol``), TLS;
    # the connection cap and the header deadline (``ledger.http.limits``).
    guard = limits.configure(max_connections=max_connections, header_timeout=header_timeout)
    options: dict[str, Any] = {
        "http": NoDelayH11Protocol,
        "loop": "ledger.http.limits:guarded_loop",
        "timeout_keep_alive": keep_alive_timeout,
    }
    if tls_cert is not None and tls_key is not None:
        server_context(tls_cert, tls_key, tls_client_ca)  # INVALID naming the file, now
        options |= {"ssl_certfile": str(tls_cert), "ssl_keyfile": str(tls_key)}
        if tls_client_ca is not None:
            # Optional: token-only clients keep working; a certificate that is sent is
            # verified by the handshake, and handed to the app by TlsH11Protocol.
            options |= {
                "ssl_ca_certs": str(tls_client_ca),
                "ssl_cert_reqs": ssl.CERT_OPTIONAL,
                "http": TlsH11Protocol,
            }

    _port_is_free(host, port)
    log_format, log_level = log_settings()
    if serve_log_level is not None:
        log_level = serve_log_level
        configure(log_format, log_level)
    _ = store().ledger  # fail now, with a typed error, if the store is unusable
    if not no_auth:
        store().credentials_list()  # ... or if no credential could be checked (R26)
    if rebuild_stale:
        store().rebuild_stale()
    auth = "bearer+client-certificate" if tls_client_ca is not None else "bearer"
    if no_auth:
        auth = "none"
    listening = {
        "url": f"{'https' if tls_cert is not None else 'http'}://{url_host(host)}:{port}",
        "db": store().db.display_url,
        "auth": auth,
        "max_connections": guard.max_connections,
        "header_timeout": header_timeout,
        "keep_alive_timeout": keep_alive_timeout,
    }
    emit(as_json, listening, lambda: click.echo(f"serving {listening['db']} on {listening['url']}"))
    # log_config=None: uvicorn's loggers go through this invocation's handler (stderr).
    if workers == 1:
        uvicorn.run(
            create_app(store().opener(), auth=not no_auth, max_waiters=max_waiters, docs=docs),
            host=host,
            port=port,
            log_level=log_level,
            log_config=None,
            **options,
        )
        return
    # Several workers: uvicorn imports the app in each of them, configured through the
    # environment; their request metrics meet in a folder of their own, removed after.
    with tempfile.TemporaryDirectory(prefix="catalog-ledger-metrics-") as folder:
        settings = {
            DB_ENV: store().db.url,
            MULTIPROC_ENV: folder,
            FORMAT_ENV: log_format,
            LEVEL_ENV: log_level,
            NO_AUTH_ENV: "1" if no_auth else "0",
            MAX_WAITERS_ENV: str(max_waiters),
            DOCS_ENV: "1" if docs else "0",
            limits.MAX_CONNECTIONS_ENV: str(guard.max_connections),
            limits.HEADER_TIMEOUT_ENV: str(header_timeout),
        }
        saved = {name: os.environ.get(name) for name in settings}
        os.environ.update(settings)
        try:
            uvicorn.run(
                "ledger.http.app:app_from_environment",
                factory=True,
                workers=workers,
                host=host,
                port=port,
                log_level=log_level,
                log_config=None,
                **options,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
