"""attempt-kernel: the typed kernel of a durable runtime for agent workflows.

This module is the public doorway: everything users import is bound here and
listed once in ``__all__``. The implementation lives in private modules.
"""

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
from ._errors import AttemptKernelError as AttemptKernelError

__all__ = [
    "Admit",
    "AttemptKernelError",
    "AttemptState",
    "Cancel",
    "Cancelled",
    "Fail",
    "Failed",
    "IllegalTransition",
    "Indeterminate",
    "Pending",
    "QueueDeadlinePassed",
    "Running",
    "StepDeadlinePassed",
    "Succeed",
    "Succeeded",
    "TimedOut",
    "TransitionCause",
    "is_terminal",
    "transition",
]
