"""Errors raised by remote vector envs.

The gymnasium error types (``AlreadyPendingCallError``, ``NoAsyncCallError``,
``ClosedEnvironmentError``) are re-used as-is so code written against
``AsyncVectorEnv`` keeps catching the right thing.
"""

from __future__ import annotations

from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError

__all__ = [
    "AlreadyPendingCallError",
    "ClosedEnvironmentError",
    "LeaseLostError",
    "NoAsyncCallError",
    "ResultError",
    "SubEnvironmentError",
    "SubEnvironmentFailedError",
]


class SubEnvironmentError(RuntimeError):
    """A sub-environment raised and restarts are disabled.

    Attributes:
        index: the sub-environment's index in the vector env.
        remote_traceback: the traceback text from the actor that hosted it.
        results: raised by ``step``/``step_wait``/``reset``, the results of the envs
            whose reply did arrive (``recv``'s form, ids in ``info["env_id"]``), so an
            error drops none of them; None otherwise (``recv`` returns them next time).
    """

    results: tuple[object, ...] | None = None

    def __init__(self, index: int, message: str, remote_traceback: str = "") -> None:
        self.index = index
        self.remote_traceback = remote_traceback
        text = f"sub-environment {index}: {message}"
        if remote_traceback:
            text += f"\n--- remote traceback (sub-environment {index}) ---\n{remote_traceback}"
        super().__init__(text)


class SubEnvironmentFailedError(SubEnvironmentError):
    """A sub-environment kept failing after ``max_restarts`` restarts."""


class ResultError(SubEnvironmentError):
    """A call's result reached the driver but could not be received (``RaySystemError``,
    a reply that does not unpickle here, e.g. an object whose class only the actor's
    runtime env can import). The envs are not restarted (it is not their fault); the
    vector env stays usable."""


class LeaseLostError(RuntimeError):
    """This trainer's lease on pool envs ended (expired, and another trainer took them).

    Raised by the env actors themselves when a call carries a lease older than the
    one they hold (a fenced lease), so a trainer that resumes after a long pause
    never steps envs that are someone else's now. Attach again for new envs.
    """
