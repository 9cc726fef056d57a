"""Server settings the CLI declares before it imports the server (issue 25.7).

Standard library only: ``serve --help`` shows ``--max-waiters``' default, and
``serve --workers N`` names the metrics folder, without importing FastAPI,
uvicorn or prometheus-client. ``ledger.http.watch`` and ``ledger.http.metrics``
use these names.
"""

from __future__ import annotations

#: The default bound of watches (``?wait=``) waiting at once per worker.
MAX_WAITERS = 1000
#: The environment variable prometheus-client's multiprocess mode reads.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
