"""The run layer: one run's children, from spawn to the last signal, and reaping them later.

Owns starting, watching, restarting, draining and stopping the proxies of a run
(``supervise``, with ``command``, ``binaryflags``, ``runfiles``, ``messages``,
``interrupts``), asking a run's owner to stop from another process (``remotestop``), pruning
ended runs (``prune``), reaping runs whose owner is gone (``reap``), reaching every node of a Ray
cluster (``cluster``) and the named crash points the crash tests kill us at (``crashpoints``).

Fires state-machine events (``sidecar_fsm.state.fsm``) and never sets a state itself. May import
``state``, ``base``, ``config`` and ``errors``; must not import ``view`` or the public modules
(``launcher``, ``cli``): what runs must not depend on how it is shown.
"""
