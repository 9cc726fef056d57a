"""Server settings the CLI declares before it imports the server (issue 25.7).

Standard library only: ``serve --help`` shows the defaults of ``--max-waiters`` and of
the header and keep-alive timeouts, and ``serve --workers N`` names the metrics folder,
without importing FastAPI, uvicorn, prometheus-client or asyncio. ``ledger.http.watch``,
``ledger.http.metrics`` and ``ledger.http.limits`` use these names.
"""

from __future__ import annotations

#: Seconds a request has to deliver its whole header block (``serve --header-timeout``).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open (``serve --keep-alive-timeout``).
KEEP_ALIVE_TIMEOUT = 5.0
#: The default bound of watches (``?wait=``) waiting at once per worker.
MAX_WAITERS = 1000
#: The environment variable prometheus-client's multiprocess mode reads.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
