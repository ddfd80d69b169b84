"""The run layer: one run's children, from spawn to the last signal, and reaping them later.

Owns starting, watching, restarting, draining and stopping the proxies of a run
(``supervise``'s ``NodeSidecars`` over the jobs ``start``, ``watch`` and ``stop`` and their
shared ``children``, with ``command``, ``binaryflags``, ``runfiles``, ``messages``,
``interrupts``; ``upcheck`` awaits the start's upstream verdicts, ``targets`` keeps the
Prometheus target file, ``traffic`` brings each proxy's traffic figures into the database),
asking a run's owner to stop from another process (``remotestop``), pruning ended runs
(``prune``), reaping runs whose owner is gone (``reap``: observe, then act on the plan),
reaching every node of a Ray cluster (``cluster``), the named crash points the crash tests
kill us at (``crashpoints``), and the ``probe`` command's child (the proxy's ``-probe`` mode,
which belongs to no run).

Fires state-machine events (``sidecar_fsm.state.fsm``) and never sets a state itself; what runs
now is ``observe``'s judgement, never re-derived here. May import ``observe``, ``state``,
``base``, ``config`` and ``errors``; must not import ``view`` or the public modules
(``launcher``, ``cli``): what runs must not depend on how it is shown.
"""
