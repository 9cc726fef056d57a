"""Test-owned MariaDB servers on loopback: a 3-node Galera cluster and a primary/replica pair.

Every server is the test's own: a ``mariadbd`` started from a datadir made by
``mariadb-install-db --user=mysql`` in a fresh temporary directory, listening on
free loopback ports (never the shared server on 3306), run as the ``mysql`` user
(rsync state transfer fails with "Permission denied" when a node runs as root).
Each server runs in a process group of its own; ``close`` (and an ``atexit`` hook,
for a test run that dies) kills the group and every process still naming the
temporary directory (rsync daemons of a state transfer), then removes the directory.

Galera: ``wsrep_on``, the provider found with ``dpkg -L galera-4``, ``gcomm://``
addresses of all nodes, per node ``gmcast.listen_addr``, ``ist.recv_addr`` and
``wsrep_sst_receive_address`` on ports of their own, ``wsrep_sst_method=rsync``,
``binlog_format=ROW``, ``innodb_autoinc_lock_mode=2``; the first node bootstraps
with ``--wsrep-new-cluster``. A cluster is ready when every node reports
``wsrep_local_state_comment = Synced`` and the cluster size is right.

Replica pair: a primary with ``server_id=1`` and ``log_bin``, and a replica with
``server_id=2``, ``log_bin``, ``read_only`` and ``CHANGE MASTER TO ...
MASTER_USE_GTID=slave_pos``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql

MARIADBD = shutil.which("mariadbd", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
SHARED_PORT = 3306
#: How long one node may take to come up (a state transfer included).
START_TIMEOUT = 120.0

_LIVE: dict[int, Node] = {}
_LIVE_LOCK = threading.Lock()


class ClusterError(AssertionError):
    """A test-owned server did not come up (the message carries its error log tail)."""


def galera_provider() -> str:
    """The path of ``libgalera_smm.so``, as ``dpkg -L galera-4`` lists it."""
    try:
        listed = subprocess.run(
            ["dpkg", "-L", "galera-4"], capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ClusterError(
            f"the galera-4 package is not installed ({exc}); `apt-get install -y galera-4 rsync`"
        ) from None
    found = [p for p in listed if p.endswith("/libgalera_smm.so") and Path(p).is_file()]
    if not found:
        raise ClusterError("galera-4 is installed but lists no libgalera_smm.so")
    return sorted(found, key=len)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody listens on right now (never 3306)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            port = int(sock.getsockname()[1])
            if port != SHARED_PORT and port not in ports:
                ports.append(port)
    finally:
        for sock in held:
            sock.close()
    return ports


def _runs_as() -> tuple[int, int] | None:
    """(uid, gid) of ``mysql`` when we are root; ``None``: run as ourselves."""
    if os.geteuid() != 0:
        return None
    entry = pwd.getpwnam("mysql")
    return entry.pw_uid, entry.pw_gid


def make_home(prefix: str) -> Path:
    """A fresh temporary directory the ``mysql`` user can reach (mode 755, owned by it)."""
    home = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    home.chmod(0o755)
    owner = _runs_as()
    if owner is not None:
        os.chown(home, *owner)
    return home


def _chown_tree(path: Path) -> None:
    owner = _runs_as()
    if owner is None:
        return
    os.chown(path, *owner)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), *owner, follow_symlinks=False)


def _processes_naming(marker: str) -> list[int]:
    """Pids of live processes whose command line names ``marker`` (our temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(int(entry.name))
    return found


def kill_strays(home: Path) -> None:
    """SIGKILL every process still naming ``home`` (e.g. an SST's rsync daemon)."""
    for _ in range(3):
        pids = _processes_naming(str(home))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def admin(
    port: int, database: str | None = None, *, user: str = "root", password: str = ""
) -> pymysql.connections.Connection[Any]:
    """An autocommit connection over TCP to a test-owned server."""
    return pymysql.connect(
        host="127.0.0.1",
        port=port,
        user=user,
        password=password,
        database=database,
        autocommit=True,
        charset="utf8mb4",
        connect_timeout=3,
        read_timeout=60,
        write_timeout=60,
        ssl_disabled=True,  # as bench.common.mysql_connect: no TLS context per connection
    )


def query(port: int, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with admin(port) as conn, conn.cursor() as cur:
        cur.execute(sql, tuple(args) or None)  # no arguments: no %-formatting of ``sql``
        return list(cur.fetchall())


def status_value(port: int, name: str) -> str | None:
    rows = query(port, "SHOW GLOBAL STATUS LIKE %s", (name,))
    return str(rows[0][1]) if rows else None


@dataclass
class Node:
    """One test-owned ``mariadbd``: its directory, port, settings and process."""

    name: str
    home: Path
    port: int
    settings: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    _log: Any = field(default=None, repr=False)

    @property
    def datadir(self) -> Path:
        return self.home / "data"

    @property
    def tmpdir(self) -> Path:
        return self.home / "tmp"

    @property
    def error_log(self) -> Path:
        return self.home / "error.log"

    @property
    def cnf(self) -> Path:
        return self.home / "my.cnf"

    def url(self, database: str, *, user: str = "root", password: str = "") -> str:
        auth = f"{user}:{password}" if password else user
        return f"mysql+pymysql://{auth}@127.0.0.1:{self.port}/{database}"

    def install(self) -> None:
        """A fresh datadir by ``mariadb-install-db`` (root without password on loopback)."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.datadir.mkdir(exist_ok=True)
        self.tmpdir.mkdir(exist_ok=True)
        _chown_tree(self.home)
        user = ["--user=mysql"] if _runs_as() is not None else []
        done = subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={self.datadir}",
                f"--tmpdir={self.tmpdir}",  # parallel installs collide in a shared /tmp
                *user,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(
                f"mariadb-install-db failed for {self.name}: {done.stdout[-1500:]}"
                f"{done.stderr[-1500:]}"
            )
        self.write_cnf()

    def write_cnf(self) -> None:
        lines = [
            "[mariadbd]",
            f"datadir={self.datadir}",
            f"tmpdir={self.tmpdir}",
            f"socket={self.home / 'mysqld.sock'}",
            f"pid-file={self.home / 'mysqld.pid'}",
            f"log-error={self.error_log}",
            f"port={self.port}",
            "bind-address=127.0.0.1",
            "skip-name-resolve",
            "innodb_buffer_pool_size=64M",
            "innodb_flush_log_at_trx_commit=2",
            "max_connections=400",
            *(f"{k}={v}" if v != "" else k for k, v in self.settings.items()),
            "",
        ]
        self.cnf.write_text("\n".join(lines), encoding="utf-8")
        _chown_tree(self.home)

    def start(self, *extra: str) -> None:
        """Start ``mariadbd`` as ``mysql`` in a process group of its own (not waiting)."""
        if self.alive:
            raise ClusterError(f"{self.name} is already running")
        owner = _runs_as()
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.home),
            "LANG": "C",
        }
        self._log = (self.home / "stdout.log").open("ab")
        self.proc = subprocess.Popen(
            [MARIADBD, f"--defaults-file={self.cnf}", *extra],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.home,
            start_new_session=True,
            user=owner[0] if owner else None,
            group=owner[1] if owner else None,
        )
        self.starts += 1
        with _LIVE_LOCK:
            _LIVE[self.proc.pid] = self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def error_tail(self, lines: int = 40) -> str:
        try:
            text = self.error_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = "(no error log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_until(
        self, ready: Callable[[], bool], what: str, timeout: float = START_TIMEOUT
    ) -> None:
        """Poll ``ready`` until true; a dead process or the deadline fails with the log tail."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterError(
                    f"{self.name} (port {self.port}) exited with {self.proc.returncode} before "
                    f"{what}; error log tail:\n{self.error_tail()}"
                )
            try:
                if ready():
                    return
            except pymysql.err.MySQLError as exc:
                last = exc
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"{self.name} (port {self.port}) was not {what} within {timeout:.0f} s "
                    f"(last: {last}); error log tail:\n{self.error_tail()}"
                )
            time.sleep(0.2)

    def wait_accepting(self, timeout: float = START_TIMEOUT) -> None:
        def answers() -> bool:
            query(self.port, "SELECT 1")
            return True

        self.wait_until(answers, "accepting connections", timeout)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the node's process group (SIGKILL: a crash)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        with _LIVE_LOCK:
            _LIVE.pop(self.proc.pid, None)
        if self._log is not None:
            self._log.close()
            self._log = None


def _kill_all_at_exit() -> None:
    with _LIVE_LOCK:
        nodes = list(_LIVE.values())
    for node in nodes:
        node.kill()
        kill_strays(node.home)


atexit.register(_kill_all_at_exit)


class _Servers:
    """What both setups share: their home directory, nodes and teardown."""

    def __init__(self, prefix: str) -> None:
        self.home = make_home(prefix)
        self.nodes: list[Node] = []

    def close(self) -> None:
        """Kill every node's process group and strays, then remove the directory."""
        for node in self.nodes:
            node.kill()
        kill_strays(self.home)
        shutil.rmtree(self.home, ignore_errors=True)

    def create_database(self, port: int, name: str) -> None:
        query(port, f"CREATE DATABASE IF NOT EXISTS `{name}`")


def _parallel(calls: Sequence[Callable[[], None]]) -> None:
    """Run ``calls`` in threads; re-raise the first failure."""
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class GaleraCluster(_Servers):
    """A Galera cluster of ``size`` nodes on loopback, owned by one test module."""

    def __init__(self, size: int = 3) -> None:
        super().__init__("cl-galera-")
        provider = galera_provider()
        ports = free_ports(4 * size)
        self.gcomm = [ports[4 * i + 1] for i in range(size)]
        address = "gcomm://" + ",".join(f"127.0.0.1:{p}" for p in self.gcomm)
        cluster_name = f"cl-test-{secrets.token_hex(4)}"
        for i in range(size):
            port, gmcast, ist, sst = ports[4 * i : 4 * i + 4]
            options = ";".join(
                [
                    f"gmcast.listen_addr=tcp://127.0.0.1:{gmcast}",
                    f"ist.recv_addr=127.0.0.1:{ist}",
                    "gcache.size=64M",
                    # Notice a killed node in seconds, not the default tens of seconds.
                    "evs.keepalive_period=PT0.5S",
                    "evs.inactive_check_period=PT0.5S",
                    "evs.suspect_timeout=PT3S",
                    "evs.inactive_timeout=PT6S",
                    "evs.install_timeout=PT6S",
                ]
            )
            self.nodes.append(
                Node(
                    name=f"galera{i + 1}",
                    home=self.home / f"node{i + 1}",
                    port=port,
                    settings={
                        "wsrep_on": "ON",
                        "wsrep_provider": provider,
                        "wsrep_cluster_name": cluster_name,
                        "wsrep_cluster_address": address,
                        "wsrep_node_name": f"galera{i + 1}",
                        "wsrep_node_address": f"127.0.0.1:{gmcast}",
                        "wsrep_node_incoming_address": f"127.0.0.1:{port}",
                        "wsrep_provider_options": f'"{options}"',
                        "wsrep_sst_receive_address": f"127.0.0.1:{sst}",
                        "wsrep_sst_method": "rsync",
                        "binlog_format": "ROW",
                        "default_storage_engine": "InnoDB",
                        "innodb_autoinc_lock_mode": "2",
                    },
                )
            )

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def start(self) -> None:
        _parallel([n.install for n in self.nodes])
        first, *rest = self.nodes
        first.start("--wsrep-new-cluster")
        self.wait_synced(first)
        for node in rest:  # one state transfer at a time: the donor serves one joiner
            node.start()
            self.wait_synced(node)
        self.wait_size(len(self.nodes))

    def wait_synced(self, node: Node, timeout: float = START_TIMEOUT) -> None:
        node.wait_until(
            lambda: status_value(node.port, "wsrep_local_state_comment") == "Synced",
            "Synced (wsrep_local_state_comment)",
            timeout,
        )

    def wait_size(self, size: int, timeout: float = 60.0) -> None:
        """Every live node sees a primary component of ``size`` nodes."""
        for node in self.nodes:
            if node.alive:
                self._wait_primary(node, size, timeout)

    @staticmethod
    def _wait_primary(node: Node, size: int, timeout: float) -> None:
        def ready() -> bool:
            return (
                status_value(node.port, "wsrep_cluster_size") == str(size)
                and status_value(node.port, "wsrep_cluster_status") == "Primary"
            )

        node.wait_until(ready, f"in a primary component of {size} nodes", timeout)

    def crash(self, index: int) -> None:
        """SIGKILL node ``index``'s process group."""
        self.nodes[index].kill()

    def restart(self, index: int) -> None:
        """Start a killed node again: it rejoins (IST or SST) and becomes Synced."""
        node = self.nodes[index]
        node.start()
        self.wait_synced(node)
        self.wait_size(len(self.nodes))

    def create_database(self, port: int, name: str) -> None:
        super().create_database(port, name)
        for node in self.nodes:  # DDL is replicated in total order; wait until visible
            if node.alive:
                self._wait_database(node, name)

    @staticmethod
    def _wait_database(node: Node, name: str) -> None:
        def ready() -> bool:
            return bool(query(node.port, "SHOW DATABASES LIKE %s", (name,)))

        node.wait_until(ready, f"showing database {name}", 30)


@dataclass(frozen=True)
class ReplicationStatus:
    io_running: bool
    sql_running: bool
    seconds_behind: int | None
    last_error: str


class ReplicaPair(_Servers):
    """A MariaDB primary and one asynchronous replica of it (GTID replication)."""

    REPL_USER = "repl"
    REPL_PASSWORD = "repl-" + secrets.token_hex(6)

    def __init__(self) -> None:
        super().__init__("cl-replica-")
        primary_port, replica_port = free_ports(2)
        self.primary = Node(
            name="primary",
            home=self.home / "primary",
            port=primary_port,
            settings={
                "server_id": "1",
                "log_bin": str(self.home / "primary" / "binlog"),
                "binlog_format": "ROW",
                "gtid_strict_mode": "ON",
            },
        )
        self.replica = Node(
            name="replica",
            home=self.home / "replica",
            port=replica_port,
            settings={
                "server_id": "2",
                "log_bin": str(self.home / "replica" / "binlog"),
                "relay_log": str(self.home / "replica" / "relay"),
                "binlog_format": "ROW",
                "gtid_strict_mode": "ON",
                "read_only": "ON",
                "log_output": "TABLE",
            },
        )
        self.nodes = [self.primary, self.replica]

    def start(self) -> None:
        _parallel([n.install for n in self.nodes])
        for node in self.nodes:
            node.start()
        for node in self.nodes:
            node.wait_accepting()
        with admin(self.primary.port) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(
                f"CREATE USER '{self.REPL_USER}'@'127.0.0.1' IDENTIFIED BY %s",
                (self.REPL_PASSWORD,),
            )
            cur.execute(f"GRANT REPLICATION SLAVE ON *.* TO '{self.REPL_USER}'@'127.0.0.1'")
        with admin(self.replica.port) as conn, conn.cursor() as cur:
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %s, "
                "MASTER_USER = %s, MASTER_PASSWORD = %s, MASTER_CONNECT_RETRY = 1, "
                "MASTER_USE_GTID = slave_pos",
                (self.primary.port, self.REPL_USER, self.REPL_PASSWORD),
            )
            cur.execute("START SLAVE")
        self.replica.wait_until(
            lambda: (s := self.status()).io_running and s.sql_running,
            "replicating (Slave_IO_Running and Slave_SQL_Running)",
            60,
        )

    def status(self) -> ReplicationStatus:
        with admin(self.replica.port) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row = cur.fetchone()
        if row is None:
            return ReplicationStatus(False, False, None, "not configured")
        behind = row.get("Seconds_Behind_Master")
        return ReplicationStatus(
            io_running=row.get("Slave_IO_Running") == "Yes",
            sql_running=row.get("Slave_SQL_Running") == "Yes",
            seconds_behind=None if behind is None else int(behind),
            last_error=str(row.get("Last_Error") or row.get("Last_IO_Error") or ""),
        )

    def create_reader(self, user: str, password: str, database: str) -> None:
        """A replica-only account that may SELECT the store and watch replication, nothing
        else (created with the replica's binlog off, so it exists only there)."""
        with admin(self.replica.port) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute(f"CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY %s", (password,))
            cur.execute(f"GRANT SELECT ON `{database}`.* TO '{user}'@'127.0.0.1'")
            cur.execute(f"GRANT SLAVE MONITOR ON *.* TO '{user}'@'127.0.0.1'")

    def pause(self) -> None:
        query(self.replica.port, "STOP SLAVE SQL_THREAD")

    def resume(self) -> None:
        query(self.replica.port, "START SLAVE SQL_THREAD")

    def wait_caught_up(self, timeout: float = 60.0) -> None:
        """The replica has applied everything the primary has binlogged so far."""
        (target,) = query(self.primary.port, "SELECT @@GLOBAL.gtid_binlog_pos")[0]
        port = self.replica.port

        def applied() -> bool:
            return bool(query(port, "SELECT MASTER_GTID_WAIT(%s, 1)", (str(target),))[0][0] == 0)

        self.replica.wait_until(applied, f"caught up to GTID {target}", timeout)


@contextlib.contextmanager
def running(servers: GaleraCluster | ReplicaPair) -> Iterator[Any]:
    """Start ``servers``; always tear them down, even when the start or the test fails."""
    try:
        servers.start()
        yield servers
    finally:
        servers.close()
