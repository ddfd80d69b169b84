"""The state layer: what is recorded, and the only code that records it.

Owns the instance state machine (``fsm``: the only code that changes an instance's state), the
per-host SQLite database (``store``: the only code that speaks SQL; ``dbfile``: opening,
migrating and refusing the file; ``tempfiles``: what a killed creation of it left), storage
faults seen on that file (``storagefault``), the host name a database is keyed by
(``hostname``) and the cached store of a live run (``sharedstore``).

May import ``sidecar_fsm.errors``, ``sidecar_fsm.config`` and ``sidecar_fsm.base``. Must not
import ``run``, ``view`` or the public modules above them: whatever starts, stops or shows
processes sits above the record of them, never inside it.
"""
