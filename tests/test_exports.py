"""The public doorway: `__all__` is what the package binds, and classes are final."""

from __future__ import annotations

import dataclasses
import inspect
import types

import attempt_kernel

# Hand-written: the public names promised by the kernel issue, plus the
# error family's base class.
EXPECTED_PUBLIC = {
    "Pending", "Running", "Succeeded", "Failed", "Indeterminate", "Cancelled",
    "TimedOut", "AttemptState",
    "Admit", "Succeed", "Fail", "Cancel", "QueueDeadlinePassed",
    "StepDeadlinePassed", "TransitionCause",
    "transition", "IllegalTransition", "is_terminal", "AttemptKernelError",
    "Planned", "Dispatched", "Confirmed", "Rejected", "Abandoned", "IntentState",
    "Dispatch", "Confirm", "Reject", "Abandon", "IntentCause", "intent_transition",
    "IllegalIntentTransition", "is_outstanding", "intent_dispatched", "idempotency_key",
    "RunLogWriter", "read_log", "Record", "CorruptLine", "TornTail", "replay",
    "ReplayReport", "Violation", "OpenAttempt",
}  # fmt: skip
STATES_AND_CAUSES = [
    "Pending", "Running", "Succeeded", "Failed", "Indeterminate", "Cancelled",
    "TimedOut", "Admit", "Succeed", "Fail", "Cancel", "QueueDeadlinePassed",
    "StepDeadlinePassed", "Planned", "Dispatched", "Confirmed", "Rejected",
    "Abandoned", "Dispatch", "Confirm", "Reject", "Abandon", "AttemptCreated",
    "AttemptTransitioned", "IntentPlanned", "IntentChanged", "StepResult", "RunFinished",
    "Record", "CorruptLine", "TornTail",
]  # fmt: skip


def test_all_lists_exactly_the_public_bindings() -> None:
    """Every non-underscore, non-module binding is in __all__, and vice versa."""
    bound = {
        name
        for name, value in vars(attempt_kernel).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(attempt_kernel.__all__) == bound
    assert len(attempt_kernel.__all__) == len(set(attempt_kernel.__all__))


def test_public_names_are_the_promised_ones() -> None:
    """The public API is the hand-written list, spelled exactly."""
    assert set(attempt_kernel.__all__) >= EXPECTED_PUBLIC


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
