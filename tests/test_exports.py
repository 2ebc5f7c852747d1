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
}  # fmt: skip
STATES_AND_CAUSES = [
    "Pending", "Running", "Succeeded", "Failed", "Indeterminate", "Cancelled",
    "TimedOut", "Admit", "Succeed", "Fail", "Cancel", "QueueDeadlinePassed",
    "StepDeadlinePassed",
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


def test_illegal_transition_is_in_the_error_family() -> None:
    """IllegalTransition derives from the library's base error and is final."""
    assert issubclass(attempt_kernel.IllegalTransition, attempt_kernel.AttemptKernelError)
    assert getattr(attempt_kernel.IllegalTransition, "__final__", False) is True
