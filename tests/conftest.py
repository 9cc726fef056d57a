"""Real engines for every test: a fresh SQLite file, and a fresh MariaDB/MySQL database.

MySQL-family tests use the server named by ``CATALOG_LEDGER_TEST_MYSQL``
(default: the MariaDB at ``mysql+pymysql://root@127.0.0.1:3306/test``). Each
test gets its own database on that server, created empty and dropped after.
When no server answers and a Docker engine does, a throwaway MySQL 8 is
started with testcontainers. When neither is available the MySQL-family tests
fail with a message saying how to point them at a server: they are never
silently skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from hypothesis import settings
from sqlalchemy.engine import make_url

from bench.common import DEFAULT_MYSQL, mysql_connect, mysql_scratch
from ledger.log.db import Database, open_database
from ledger.store.init import init_store
from tests.support.cluster_support import GaleraCluster, ReplicaPair, running
from tests.support.lifecycle_support import World
from tests.support.stores import INITIALIZED, BuiltStores, MariaDBStores, SqliteTemplate

MYSQL_ENV = "CATALOG_LEDGER_TEST_MYSQL"

#: The default run is a regression gate: its property tests draw the same examples
#: every time (derandomized), so a red run is reproducible and main never goes red
#: by luck. The campaigns (``-m campaign``) explore: fresh random examples each run.
settings.register_profile("gate", derandomize=True, database=None)
settings.register_profile("explore")


#: The slowest modules of the default run, longest first. ``--dist loadfile`` deals
#: modules to the workers in collection order, so one of these dealt last kept a worker
#: busy for 15-20 s after the others had finished; dealt first, the short modules fill
#: in around them. Only the order of modules changes, never the order within one.
SLOWEST_FIRST = (
    "tests/rules/test_r28_view_tampering.py",
    "tests/rules/test_projections.py",
    "tests/e2e/test_r26_client.py",
    "tests/e2e/test_r18_watch_and_http.py",
    "tests/rules/test_lifecycle_matrix.py",
    "tests/e2e/test_hostile_input.py",
    "tests/engines/test_r12_galera.py",
    "tests/e2e/test_r26_http_auth.py",
    "tests/rules/test_r16_incremental_publish.py",
    "tests/e2e/test_r29_attack_matrix.py",
    "tests/e2e/test_r26_serve_limits.py",
    "tests/e2e/test_apply_plan.py",
    "tests/engines/test_crash_sweep.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: n for n, module in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_configure(config: pytest.Config) -> None:
    explicit = os.environ.get("HYPOTHESIS_PROFILE")
    exploring = "campaign" in (config.option.markexpr or "").replace("not campaign", "")
    settings.load_profile(explicit or ("explore" if exploring else "gate"))


ENGINES = ["sqlite", "mariadb"]


@dataclass
class Server:
    """A MySQL-family server the tests may create databases on."""

    url: str

    def connect(self, database: str | None = None) -> pymysql.connections.Connection[Any]:
        return mysql_connect(self.url, database, connect_timeout=5)

    def database_url(self, name: str) -> str:
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    @contextmanager
    def scratch(self) -> Iterator[str]:
        """A fresh, empty database on this server (server default collation), dropped after."""
        with mysql_scratch(self.url, prefix="cl_") as (url, _):
            yield url


def _answers(url: str) -> str | None:
    try:
        Server(url).connect().close()
    except Exception as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def mysql_server() -> Iterator[Server]:
    url = os.environ.get(MYSQL_ENV, DEFAULT_MYSQL)
    problem = _answers(url)
    if problem is None:
        yield Server(url)
        return
    if shutil.which("docker") and os.system("docker info >/dev/null 2>&1") == 0:
        from testcontainers.mysql import MySqlContainer

        with MySqlContainer("mysql:8.0", username="root", password="test") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(3306)
            yield Server(f"mysql+pymysql://root:test@{host}:{port}/test")
        return
    pytest.fail(
        f"No MySQL-family server answers at {url} ({problem}) and no Docker engine is "
        f"available for a throwaway one. Start MariaDB (e.g. `start-stop-daemon --start "
        f"--oknodo --background --exec /usr/sbin/mariadbd`) or set {MYSQL_ENV} to "
        f"mysql+pymysql://USER:PASSWORD@HOST:PORT/DATABASE.",
        pytrace=False,
    )


@pytest.fixture
def mysql_url(mysql_server: Server) -> Iterator[str]:
    """A fresh, empty database on the MySQL-family server (server default collation)."""
    with mysql_server.scratch() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> SqliteTemplate:
    """This worker's initialized SQLite store, copied for each ``world`` and ``db``."""
    return SqliteTemplate(tmp_path_factory.mktemp("template"))


@pytest.fixture(scope="session")
def mariadb_stores(mysql_server: Server) -> Iterator[MariaDBStores]:
    """This worker's initialized MariaDB databases, emptied and reused between tests."""
    stores = MariaDBStores(mysql_server.url, mysql_server.connect, mysql_server.database_url)
    yield stores
    stores.close()


@pytest.fixture(scope="session")
def _built_stores(tmp_path_factory: pytest.TempPathFactory) -> BuiltStores:
    return BuiltStores(tmp_path_factory.mktemp("built"))


@pytest.fixture
def built_stores(
    _built_stores: BuiltStores, engine_url: str, request: pytest.FixtureRequest
) -> BuiltStores:
    """Histories built once per worker and copied into each test's store
    (``tests/support/stores.py``)."""
    if not engine_url.startswith("sqlite"):
        _built_stores.mariadb = request.getfixturevalue("mariadb_stores")
    return _built_stores


#: The fixtures that build a store on ``engine_url`` (they get it initialized).
BUILDS_A_STORE = {"world", "db", "stage"}


@pytest.fixture(params=ENGINES)
def engine_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh store URL on each real engine: not yet initialized, except for a test that
    uses a fixture in ``BUILDS_A_STORE`` (``world``, ``db``...): that one gets it in exactly
    the state ``init`` leaves (a copy of this worker's template store, see
    ``tests/support/stores.py``)."""
    initialized = bool(BUILDS_A_STORE & set(request.fixturenames))
    if request.param == "sqlite":
        url = str(request.getfixturevalue("sqlite_url"))
        if initialized:
            template: SqliteTemplate = request.getfixturevalue("sqlite_template")
            template.copy_to(Path(url.removeprefix("sqlite:///")))
            INITIALIZED.add(url)
        yield url
        INITIALIZED.discard(url)
        return
    if not initialized:
        yield str(request.getfixturevalue("mysql_url"))
        return
    stores: MariaDBStores = request.getfixturevalue("mariadb_stores")
    url = stores.take()
    INITIALIZED.add(url)
    try:
        yield url
    finally:
        INITIALIZED.discard(url)
        stores.give_back(url)


@pytest.fixture
def sibling_url(engine_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A second fresh store on the engine of ``engine_url`` (not yet initialized)."""
    if engine_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'sibling.db'}"
        return
    server: Server = request.getfixturevalue("mysql_server")
    with server.scratch() as url:
        yield url


@pytest.fixture
def sibling_store(engine_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A second store on the engine of ``engine_url``, in exactly the state ``init``
    leaves (from this worker's template, like ``world``'s; a store id of its own)."""
    if engine_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'sibling-store.db'}"
        template: SqliteTemplate = request.getfixturevalue("sqlite_template")
        template.copy_to(tmp_path / "sibling-store.db")
        INITIALIZED.add(url)
        yield url
        INITIALIZED.discard(url)
        return
    stores: MariaDBStores = request.getfixturevalue("mariadb_stores")
    url = stores.take()
    INITIALIZED.add(url)
    try:
        yield url
    finally:
        INITIALIZED.discard(url)
        stores.give_back(url)


@pytest.fixture
def db(engine_url: str) -> Iterator[Database]:
    """An initialized store on each real engine."""
    database = open_database(engine_url)
    if engine_url not in INITIALIZED:
        init_store(database)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def world(engine_url: str, tmp_path: Path) -> Iterator[World]:
    """A store on each real engine with a git repository and the command service."""
    w = World(tmp_path, engine_url)
    yield w
    w.close()


@pytest.fixture(scope="module")
def galera_cluster() -> Iterator[GaleraCluster]:
    """This module's own 3-node Galera cluster on free loopback ports (never 3306), every
    node Synced; killed and removed after the module, whatever happened (R12)."""
    with running(GaleraCluster(3)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def replica_pair() -> Iterator[ReplicaPair]:
    """This module's own MariaDB primary and asynchronous replica (R19), replicating."""
    with running(ReplicaPair()) as pair:
        yield pair
