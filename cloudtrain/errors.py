"""One error root for cloudtrain. Every message says what is wrong and how to fix it."""

from __future__ import annotations

from cloudtrain.contract import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE  # the one table of exit codes

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_USAGE", "CapacityError", "CloudtrainError", "CredentialsError",
           "HandleError", "HomeError", "NodeStartError", "PackagingError", "ProviderNotFound", "ProviderNotInstalled",
           "SpecError", "TransientError", "UserError"]


class CloudtrainError(Exception):
    """Root of every error cloudtrain raises on purpose.

    ``remedy`` is the fix a user should apply; ``field`` names the spec field or flag at fault.
    """

    exit_code = EXIT_FAILED

    def __init__(self, message: str, *, remedy: str | None = None, field: str | None = None) -> None:
        self.message = message
        self.remedy = remedy
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.field}: {self.message}" if self.field else self.message
        if self.remedy:
            text += f"\n  fix: {self.remedy}"
        return text


class UserError(CloudtrainError):
    """Bad input: printed without a traceback, exit code 2, nothing started or staged."""

    exit_code = EXIT_USAGE


class SpecError(UserError):
    """The job spec (YAML, flags or Python objects) is invalid."""


class ProviderNotFound(UserError):
    """No provider is registered under the requested name."""


class ProviderNotInstalled(UserError):
    """The provider exists but its optional dependencies (extra) are missing."""


class HandleError(UserError):
    """A job handle could not be parsed or names no known job."""


class PackagingError(UserError):
    """The source directory cannot be packaged (missing, too large, secrets ...)."""


class CredentialsError(UserError):
    """A cloud's credentials are missing, expired or not allowed to do what was asked."""


class HomeError(UserError):
    """cloudtrain's own files (``CLOUDTRAIN_HOME``: the job database, the local store, job folders) cannot be written
    or read: a full disk, a read-only folder, a locked database. Names the path; nothing is left half-written."""


class NodeStartError(UserError):
    """A node cannot start: its environment does not say its place in the cluster, its node contract or requirements
    fail. The node says why in one line, records it in its status file and exits EXIT_USAGE (cloudtrain/node/entry.py);
    the planner, deriving the same place for a plan (cloudtrain/node/launch.py), reports it as bad input."""


class TransientError(CloudtrainError):
    """A platform API call failed in a way that passes (a timeout, a 5xx, throttling, a reset connection): the
    job's state is unknown, not changed. Recovery retries with backoff and never takes it for a preemption."""


class CapacityError(UserError):
    """The platform refused the job for capacity or quota (SageMaker ResourceLimitExceeded, Vertex
    RESOURCE_EXHAUSTED, Azure ML quota): another provider or region of a fallback list may run it."""
