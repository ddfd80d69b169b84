"""The exceptions and warnings a caller of sidecar-fsm can catch; every module raises these.

``SidecarError`` keeps NeMo Gym's name and base (``RuntimeError``) so existing ``except`` clauses
keep working. ``ConfigError`` is bad input outside the ``sidecar:`` schema (which raises pydantic's
``ValidationError``, as Gym's does); the CLI exits 2 for both, 1 for the rest.
"""


class SidecarError(RuntimeError):
    """The sidecar could not be configured, started or kept running."""


class SidecarsStopped(SidecarError):
    """``check()``: instances stopped; ``reasons`` holds one message each (first line: why)."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("h2-ping-sidecar stopped unexpectedly:\n" + "\n".join(reasons))
        self.reasons = reasons


class ConfigError(SidecarError, ValueError):
    """A config value, flag or argument is invalid; nothing was started or changed."""


class UnusableStateError(ConfigError):
    """The log dir or state database cannot be used; nothing was created or changed. A
    ``ConfigError``: the remedy is another ``--log-dir`` / ``log_dir``."""


class SchemaTooNewError(UnusableStateError):
    """The state database was written by a newer sidecar-fsm; it is refused and left untouched."""


class ConfigWarning(UserWarning):
    """A config value was accepted but changed (an upstream's path dropped); one line, field and value."""
