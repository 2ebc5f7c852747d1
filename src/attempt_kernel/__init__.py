"""attempt-kernel: the typed kernel of a durable runtime for agent workflows.

This module is the public doorway: everything users import is bound here and
listed once in ``__all__``. The implementation lives in private modules.

POSIX only (Linux, macOS): the file log is locked with ``flock`` and made
durable with ``fsync`` on the file and its folder, which Windows does not
offer as such; importing it elsewhere says so.
"""

import sys

if sys.platform == "win32":  # pragma: no cover - the gate runs on Linux
    raise ImportError(
        "attempt-kernel runs on POSIX systems (Linux, macOS): its file log is locked with flock"
        " and made durable with fsync on the file and its folder; on Windows, use WSL"
    )

from ._version import __version__ as __version__
from ._attempt import Admit as Admit
from ._attempt import AttemptState as AttemptState
from ._attempt import Cancel as Cancel
from ._attempt import Cancelled as Cancelled
from ._attempt import Fail as Fail
from ._attempt import Failed as Failed
from ._attempt import IllegalTransition as IllegalTransition
from ._attempt import Indeterminate as Indeterminate
from ._attempt import Pending as Pending
from ._attempt import QueueDeadlinePassed as QueueDeadlinePassed
from ._attempt import Running as Running
from ._attempt import StepDeadlinePassed as StepDeadlinePassed
from ._attempt import Succeed as Succeed
from ._attempt import Succeeded as Succeeded
from ._attempt import TimedOut as TimedOut
from ._attempt import TransitionCause as TransitionCause
from ._attempt import is_terminal as is_terminal
from ._attempt import transition as transition
from ._codec import MAX_RECORD_BYTES as MAX_RECORD_BYTES
from ._codec import MAX_RECORD_DEPTH as MAX_RECORD_DEPTH
from ._codec import RecordTooLarge as RecordTooLarge
from ._codec import RunLogError as RunLogError
from ._coderun import StepFailed as StepFailed
from ._coderun import WorkflowDiverged as WorkflowDiverged
from ._codec import SCHEMA_VERSION as SCHEMA_VERSION
from ._codec import UnencodableRecord as UnencodableRecord
from ._context import Perform as Perform
from ._context import StepContext as StepContext
from ._errors import AttemptKernelError as AttemptKernelError
from ._executor import EffectRejected as EffectRejected
from ._executor import Executor as Executor
from ._executor import Job as Job
from ._executor import PoolAdmission as PoolAdmission
from ._executor import RunControl as RunControl
from ._executor import RunRefused as RunRefused
from ._outcome import RunReport as RunReport
from ._executor import RunsStopped as RunsStopped
from ._executor import Stopper as Stopper
from ._executor import StepError as StepError
from ._outcome import StepOutcome as StepOutcome
from ._executor import run_jobs as run_jobs
from ._findings import RECONCILER_DEADLINE as RECONCILER_DEADLINE
from ._findings import EffectFinding as EffectFinding
from ._findings import EffectHappened as EffectHappened
from ._findings import EffectNotHappened as EffectNotHappened
from ._findings import EffectUnknown as EffectUnknown
from ._findings import Reconciler as Reconciler
from ._intent import Abandon as Abandon
from ._intent import Abandoned as Abandoned
from ._intent import Confirm as Confirm
from ._intent import Confirmed as Confirmed
from ._intent import Dispatch as Dispatch
from ._intent import Dispatched as Dispatched
from ._intent import IllegalIntentTransition as IllegalIntentTransition
from ._intent import IntentCause as IntentCause
from ._intent import IntentState as IntentState
from ._intent import Planned as Planned
from ._intent import Reject as Reject
from ._intent import Rejected as Rejected
from ._intent import cancel_cause as cancel_cause
from ._intent import idempotency_key as idempotency_key
from ._intent import intent_dispatched as intent_dispatched
from ._intent import intent_transition as intent_transition
from ._intent import is_outstanding as is_outstanding
from ._ledger import OpenAttempt as OpenAttempt
from ._ledger import PriorStep as PriorStep
from ._ledger import RunStanding as RunStanding
from ._ledger import RunStatus as RunStatus
from ._ledger import Violation as Violation
from ._logfile import FileLog as FileLog
from ._logfile import LogLocked as LogLocked
from ._logfile import LogNeedsRecovery as LogNeedsRecovery
from ._logfile import LogOpenError as LogOpenError
from ._logfile import LogReadError as LogReadError
from ._logfile import LogWriteFailed as LogWriteFailed
from ._logfile import RunLogWriter as RunLogWriter
from ._logfile import read_log as read_log
from ._records import AttemptCreated as AttemptCreated
from ._records import AttemptTransitioned as AttemptTransitioned
from ._records import Change as Change
from ._records import CorruptLine as CorruptLine
from ._records import DomainStateSet as DomainStateSet
from ._records import IntentChanged as IntentChanged
from ._records import IntentPlanned as IntentPlanned
from ._records import IntentReconciled as IntentReconciled
from ._records import JSON as JSON
from ._records import LogItem as LogItem
from ._records import Record as Record
from ._records import RunCancelRequested as RunCancelRequested
from ._records import RunFinished as RunFinished
from ._records import RunResumed as RunResumed
from ._records import RunStarted as RunStarted
from ._records import RunStopRequested as RunStopRequested
from ._records import SignalSent as SignalSent
from ._records import StepCalled as StepCalled
from ._records import StepResult as StepResult
from ._records import TornTail as TornTail
from ._records import WaitEnded as WaitEnded
from ._records import WaitStarted as WaitStarted
from ._operate import Delivered as Delivered
from ._operate import OperationRefused as OperationRefused
from ._observe import ReleaseObserver as ReleaseObserver
from ._observe import RunObserver as RunObserver
from ._tracing import Spans as Spans
from ._operations import cancel_run as cancel_run
from ._operations import reconcile_intent as reconcile_intent
from ._operations import resume_run as resume_run
from ._operations import send_signal as send_signal
from ._recovery import Asked as Asked
from ._recovery import OrphanEnded as OrphanEnded
from ._recovery import RecoveredRun as RecoveredRun
from ._recovery import Recovery as Recovery
from ._recovery import RecoveryError as RecoveryError
from ._recovery import recover as recover
from ._recovery import recover_log as recover_log
from ._replay import ReplayReport as ReplayReport
from ._replay import replay as replay
from ._resume import Resumed as Resumed
from ._resume import Supervisor as Supervisor
from ._resume import resume_log as resume_log
from ._store import DispatchGate as DispatchGate
from ._store import DispatchRefused as DispatchRefused
from ._store import GroupCommitLog as GroupCommitLog
from ._store import Journal as Journal
from ._store import LogSource as LogSource
from ._store import RunLog as RunLog
from ._workflow import RetryPolicy as RetryPolicy
from ._workflow import RunContext as RunContext
from ._workflow import Step as Step
from ._workflow import StepFunction as StepFunction
from ._workflow import StepOptions as StepOptions
from ._workflow import Workflow as Workflow
from ._workflow import WorkflowError as WorkflowError
from ._workflow import WorkflowFunction as WorkflowFunction
from ._workflow import load_workflow as load_workflow
from ._workflow import workflow as workflow

__all__ = [
    "__version__",
    "Abandon",
    "Abandoned",
    "Admit",
    "Asked",
    "AttemptCreated",
    "AttemptKernelError",
    "AttemptState",
    "AttemptTransitioned",
    "Cancel",
    "Cancelled",
    "Change",
    "Confirm",
    "Confirmed",
    "CorruptLine",
    "Dispatch",
    "Dispatched",
    "DispatchGate",
    "DispatchRefused",
    "DomainStateSet",
    "EffectFinding",
    "EffectHappened",
    "EffectNotHappened",
    "EffectRejected",
    "EffectUnknown",
    "Executor",
    "Fail",
    "Failed",
    "FileLog",
    "GroupCommitLog",
    "IllegalIntentTransition",
    "IllegalTransition",
    "Indeterminate",
    "IntentCause",
    "IntentChanged",
    "IntentPlanned",
    "IntentReconciled",
    "IntentState",
    "Job",
    "Journal",
    "JSON",
    "LogItem",
    "LogLocked",
    "LogNeedsRecovery",
    "LogOpenError",
    "LogReadError",
    "LogSource",
    "LogWriteFailed",
    "MAX_RECORD_BYTES",
    "MAX_RECORD_DEPTH",
    "OpenAttempt",
    "OperationRefused",
    "Delivered",
    "send_signal",
    "cancel_run",
    "ReleaseObserver",
    "RunObserver",
    "resume_run",
    "reconcile_intent",
    "OrphanEnded",
    "Pending",
    "Perform",
    "Planned",
    "PoolAdmission",
    "PriorStep",
    "QueueDeadlinePassed",
    "Reconciler",
    "RECONCILER_DEADLINE",
    "Record",
    "RecordTooLarge",
    "RecoveredRun",
    "Recovery",
    "RecoveryError",
    "Reject",
    "Rejected",
    "ReplayReport",
    "Resumed",
    "RetryPolicy",
    "RunCancelRequested",
    "RunContext",
    "RunControl",
    "RunFinished",
    "RunLog",
    "RunLogError",
    "RunLogWriter",
    "Running",
    "RunRefused",
    "RunReport",
    "RunResumed",
    "RunsStopped",
    "Stopper",
    "RunStanding",
    "RunStarted",
    "RunStatus",
    "RunStopRequested",
    "SCHEMA_VERSION",
    "SignalSent",
    "Spans",
    "Step",
    "StepCalled",
    "StepContext",
    "StepDeadlinePassed",
    "StepError",
    "StepFailed",
    "StepFunction",
    "StepOptions",
    "StepOutcome",
    "StepResult",
    "Succeed",
    "Succeeded",
    "Supervisor",
    "TimedOut",
    "TornTail",
    "TransitionCause",
    "UnencodableRecord",
    "Violation",
    "WaitEnded",
    "WaitStarted",
    "Workflow",
    "WorkflowDiverged",
    "WorkflowError",
    "WorkflowFunction",
    "cancel_cause",
    "idempotency_key",
    "intent_dispatched",
    "intent_transition",
    "is_outstanding",
    "is_terminal",
    "load_workflow",
    "read_log",
    "recover",
    "recover_log",
    "replay",
    "resume_log",
    "run_jobs",
    "transition",
    "workflow",
]
