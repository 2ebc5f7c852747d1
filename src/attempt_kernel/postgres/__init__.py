"""attempt-kernel on PostgreSQL: the journal, its leases, and the workers.

The contracts they keep are docs/contracts.md, "Many workers".

Needs the ``postgres`` extra (``pip install 'attempt-kernel[postgres]'``, which
brings psycopg 3); the rest of the library does not, and the embedded
default stays the run log file. Like the package's own doorway, this module
only binds names (from private modules) and lists them once in ``__all__``.
"""

from ._lease import LeaseVerdict as LeaseVerdict
from ._lease import lease_decision as lease_decision
from ._journal import DEFAULT_SCHEMA as DEFAULT_SCHEMA
from ._journal import PG_SCHEMA_VERSION as PG_SCHEMA_VERSION
from ._journal import Lease as Lease
from ._journal import LeaseLost as LeaseLost
from ._journal import PgConnectFailed as PgConnectFailed
from ._journal import PgJournal as PgJournal
from ._journal import PgJournalError as PgJournalError
from ._journal import PgMigrationNeeded as PgMigrationNeeded
from ._journal import PgSchemaTooNew as PgSchemaTooNew
from ._journal import PgWriteFailed as PgWriteFailed
from ._journal import migrate as migrate
from ._pools import PoolMissing as PoolMissing
from ._pools import PoolState as PoolState
from ._pools import list_pools as list_pools
from ._pools import set_pool as set_pool
from ._worker import RECONNECT_FOR as RECONNECT_FOR
from ._worker import Backoff as Backoff
from ._worker import HeartbeatLate as HeartbeatLate
from ._worker import Worker as Worker
from ._worker import WorkerDeclaredDead as WorkerDeclaredDead
from ._worker import WorkerWatcher as WorkerWatcher
from ._worker import run_worker as run_worker
from ._worker import submit_run as submit_run

__all__ = [
    "Backoff",
    "DEFAULT_SCHEMA",
    "HeartbeatLate",
    "Lease",
    "LeaseLost",
    "LeaseVerdict",
    "PG_SCHEMA_VERSION",
    "PgConnectFailed",
    "PgJournal",
    "PgJournalError",
    "PgMigrationNeeded",
    "PgSchemaTooNew",
    "PgWriteFailed",
    "PoolMissing",
    "PoolState",
    "RECONNECT_FOR",
    "Worker",
    "WorkerDeclaredDead",
    "WorkerWatcher",
    "lease_decision",
    "list_pools",
    "migrate",
    "run_worker",
    "set_pool",
    "submit_run",
]
