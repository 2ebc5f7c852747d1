"""The public doorway: `__all__` is what the package binds, and classes are final."""

from __future__ import annotations

import dataclasses
import inspect
import types

import pytest

import attempt_kernel

# Hand-written, exact: the whole public surface. A name added to or dropped
# from the package fails this test, so growth is a decision, not an accident.
EXPECTED_PUBLIC = {
    "__version__",
    # the kernel (the attempt state machine)
    "Pending", "Running", "Succeeded", "Failed", "Indeterminate", "Cancelled",
    "TimedOut", "AttemptState",
    "Admit", "Succeed", "Fail", "Cancel", "QueueDeadlinePassed",
    "StepDeadlinePassed", "TransitionCause",
    "transition", "IllegalTransition", "is_terminal", "AttemptKernelError",
    # the intent record
    "Planned", "Dispatched", "Confirmed", "Rejected", "Abandoned", "IntentState",
    "Dispatch", "Confirm", "Reject", "Abandon", "IntentCause", "intent_transition",
    "IllegalIntentTransition", "is_outstanding", "intent_dispatched", "idempotency_key",
    "cancel_cause",
    # records and the storage seam
    "JSON", "Change", "RunStarted", "RunCancelRequested", "AttemptCreated",
    "AttemptTransitioned", "IntentPlanned", "IntentChanged", "StepResult",
    "RunFinished", "Record", "CorruptLine", "TornTail", "LogItem", "SCHEMA_VERSION",
    "LogSource", "RunLog", "Journal", "FileLog", "RunLogWriter", "read_log",
    "RunLogError", "LogOpenError", "LogReadError", "LogLocked", "LogNeedsRecovery",
    "LogWriteFailed", "UnencodableRecord", "RecordTooLarge", "MAX_RECORD_BYTES", "MAX_RECORD_DEPTH",
    "DispatchRefused", "GroupCommitLog", "DispatchGate",
    # replay
    "replay", "ReplayReport", "Violation", "OpenAttempt",
    # workflows, the step context, the executor
    "Workflow", "Step", "RetryPolicy", "StepFunction", "load_workflow", "WorkflowError",
    "StepContext", "Perform", "EffectRejected", "StepError",
    "Executor", "Job", "RunControl", "RunReport", "RunStatus", "StepOutcome", "run_jobs",
    # recovery
    "recover", "recover_log", "Recovery", "RecoveredRun", "PriorStep", "OrphanEnded",
    "RecoveryError", "Asked", "RECONCILER_DEADLINE",
    # operating runs
    "IntentReconciled", "DomainStateSet", "RunStopRequested", "RunResumed",
    "EffectFinding", "EffectHappened", "EffectNotHappened", "EffectUnknown", "Reconciler",
    "RunRefused", "RunsStopped", "Stopper", "RunStanding", "resume_log", "Resumed", "Supervisor",
    # many workers: the executor's seam for shared pools
    "PoolAdmission",
    # workflows as code
    "workflow", "RunContext", "WorkflowFunction", "StepOptions", "StepCalled",
    "StepFailed", "WorkflowDiverged",
    # runs that wait, and operators' actions
    "WaitStarted", "WaitEnded", "SignalSent", "OperationRefused", "Delivered",
    "send_signal", "cancel_run", "reconcile_intent", "resume_run", "RunObserver", "ReleaseObserver",
    # traces (the otel extra)
    "Spans",
}  # fmt: skip
# Public classes meant to be subclassed or implemented, hence not final:
# the error family's bases, the error a user's effect raises, and protocols.
OPEN_CLASSES = {
    "AttemptKernelError", "RunLogError", "UnencodableRecord", "EffectRejected", "DispatchRefused",
    "StepContext", "LogSource", "RunLog", "Journal", "PoolAdmission", "RunContext", "RunObserver", "ReleaseObserver",
    "GroupCommitLog", "DispatchGate",
}  # fmt: skip
STATES_AND_CAUSES = [
    "Pending", "Running", "Succeeded", "Failed", "Indeterminate", "Cancelled",
    "TimedOut", "Admit", "Succeed", "Fail", "Cancel", "QueueDeadlinePassed",
    "StepDeadlinePassed", "Planned", "Dispatched", "Confirmed", "Rejected",
    "Abandoned", "Dispatch", "Confirm", "Reject", "Abandon", "AttemptCreated",
    "AttemptTransitioned", "IntentPlanned", "IntentChanged", "StepResult", "RunFinished",
    "Record", "CorruptLine", "TornTail",
]  # fmt: skip


@pytest.mark.slow  # the installed distribution, and a subprocess
def test_the_version_is_the_installed_distributions_and_the_command_lines() -> None:
    """``__version__``, the installed metadata and ``attempt-kernel --version`` say one version."""
    import importlib.metadata
    import subprocess
    import sys

    assert attempt_kernel.__version__ == importlib.metadata.version("attempt-kernel")
    said = subprocess.run(
        [sys.executable, "-m", "attempt_kernel", "--version"], capture_output=True, text=True, check=True
    )
    assert said.stdout == f"attempt-kernel {attempt_kernel.__version__}\n"


def test_all_lists_exactly_the_public_bindings() -> None:
    """Every non-underscore, non-module binding (and ``__version__``) is in __all__, and vice versa."""
    bound = {
        name
        for name, value in vars(attempt_kernel).items()
        if (not name.startswith("_") or name == "__version__") and not isinstance(value, types.ModuleType)
    }
    assert set(attempt_kernel.__all__) == bound
    assert len(attempt_kernel.__all__) == len(set(attempt_kernel.__all__))


def test_public_names_are_exactly_the_hand_written_list() -> None:
    """The public API is the hand-written list, spelled exactly: nothing more, nothing less."""
    assert set(attempt_kernel.__all__) == EXPECTED_PUBLIC


def test_every_public_class_is_final_at_run_time() -> None:
    """Every exported class is @final (``__final__``), except the few meant to be extended."""
    classes = {
        name: value
        for name, value in vars(attempt_kernel).items()
        # On 3.10 a Callable alias (StepFunction) passes isclass; it has an origin.
        if name in attempt_kernel.__all__
        and inspect.isclass(value)
        and getattr(value, "__origin__", None) is None
    }
    assert OPEN_CLASSES <= set(classes)
    not_final = {n for n, c in classes.items() if getattr(c, "__final__", False) is not True}
    assert not_final == OPEN_CLASSES


def test_states_and_causes_are_final_frozen_dataclasses() -> None:
    """Each state and cause class is @final and a frozen, slotted dataclass."""
    for name in STATES_AND_CAUSES:
        cls = getattr(attempt_kernel, name)
        assert inspect.isclass(cls) and dataclasses.is_dataclass(cls)
        assert getattr(cls, "__final__", False) is True, name
        params = getattr(cls, "__dataclass_params__")  # not in typeshed's view
        assert params.frozen, name
        assert "__slots__" in vars(cls), name


def test_errors_are_one_family() -> None:
    """Every exception the package exports derives from AttemptKernelError."""
    errors = [
        v for v in vars(attempt_kernel).values()
        if inspect.isclass(v) and issubclass(v, BaseException)
    ]  # fmt: skip
    assert len(errors) >= 10
    for error in errors:
        assert issubclass(error, attempt_kernel.AttemptKernelError), error
    assert getattr(attempt_kernel.IllegalTransition, "__final__", False) is True


# Hand-written, exact: the optional PostgreSQL doorway.
EXPECTED_POSTGRES = {
    "DEFAULT_SCHEMA", "PG_SCHEMA_VERSION", "PgJournal", "Lease", "LeaseLost",
    "PgJournalError", "PgConnectFailed", "PgSchemaTooNew", "PgWriteFailed",
    "LeaseVerdict", "lease_decision", "Worker", "WorkerDeclaredDead", "HeartbeatLate",
    "run_worker", "submit_run", "set_pool", "list_pools", "PoolState", "PoolMissing",
    "Backoff", "RECONNECT_FOR", "WorkerWatcher",
    "migrate", "PgMigrationNeeded",
}  # fmt: skip


def test_the_postgres_module_binds_exactly_its_hand_written_list() -> None:
    """attempt_kernel.postgres: __all__ is what it binds, and is the hand-written list."""
    import attempt_kernel.postgres as postgres

    bound = {
        name
        for name, value in vars(postgres).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(postgres.__all__) == bound == EXPECTED_POSTGRES


def test_the_postgres_classes_are_final_but_the_error_base() -> None:
    """Every class attempt_kernel.postgres exports is final, except its error family's base
    and the protocol a user implements (`WorkerWatcher`, the type of ``Worker(watcher=)``)."""
    import attempt_kernel.postgres as postgres

    classes = {n for n in postgres.__all__ if inspect.isclass(getattr(postgres, n))}
    not_final = {n for n in classes if getattr(getattr(postgres, n), "__final__", False) is not True}
    assert not_final == {"PgJournalError", "WorkerWatcher"}
    assert issubclass(postgres.PgJournalError, attempt_kernel.AttemptKernelError)


def test_the_metrics_module_binds_exactly_its_hand_written_list() -> None:
    """attempt_kernel.metrics, the documented way to serve a worker's metrics from Python:
    __all__ is what it binds, and is the hand-written list; its classes are final."""
    import attempt_kernel.metrics as metrics

    bound = {
        name
        for name, value in vars(metrics).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(metrics.__all__) == bound == {"WorkerExposition", "metrics_app"}
    assert getattr(metrics.WorkerExposition, "__final__", False) is True
