"""The state layer: what is recorded, and the only code that records it.

Owns the instance state machine (``fsm``: the only code that changes an instance's state; the
state groups every layer names, ``TERMINAL``, ``WITH_PROCESS``..., are the leaf ``states``), the
per-host SQLite database (``store``: the only code that speaks SQL, returning ``records``;
``dbfile``: opening and refusing the file; ``schema``: its numbered migrations; ``query``:
read-only SELECTs over every host's documented views; ``tempfiles``: what a killed creation of
it left), storage faults seen on that file and which SQLite errors are about it
(``storagefault``), the host name a database is keyed by
(``hostname``) and the cached store of a live run (``sharedstore``).

May import ``sidecar_fsm.errors``, ``sidecar_fsm.config`` and ``sidecar_fsm.base``. Must not
import ``observe``, ``run``, ``view`` or the public modules above them: whatever starts, stops or shows
processes sits above the record of them, never inside it.
"""
