"""The exceptions a caller of sidecar-fsm can catch; every module raises these, none defines its own.

``SidecarError`` keeps NeMo Gym's name and base (``RuntimeError``) so existing ``except`` clauses
keep working. ``ConfigError`` is the bad-input case (the CLI exits 2 for it, 1 for the rest): its
message is one line naming the field and the value.
"""


class SidecarError(RuntimeError):
    """The sidecar could not be configured, started or kept running."""


class ConfigError(SidecarError, ValueError):
    """A config value, flag or argument is invalid; nothing was started or changed."""


class UnusableStateError(ConfigError):
    """The log dir or state database cannot be used (a path through a file, no permission, a
    read-only or full filesystem, a foreign or corrupt file); nothing was created or changed.

    A ``ConfigError``: the remedy is another ``--log-dir`` / ``log_dir`` (the CLI exits 2).
    """


class SchemaTooNewError(UnusableStateError):
    """The state database was written by a newer sidecar-fsm; it is refused and left untouched."""
