"""The run layer: one run's children, from spawn to the last signal, and reaping them later.

Owns starting, watching, restarting, draining and stopping a run's proxies (``supervise``'s
``NodeSidecars`` over ``start``, ``watch``, ``stop``), asking a run's owner to stop
(``remotestop``), pruning (``prune``), reaping runs whose owner is gone (``reap``), reaching a
Ray cluster's nodes (``cluster``), the crash tests' points (``crashpoints``) and the ``probe``
command's child. Every fire, spawn and signal is followed by ``crashpoints.hit``.

Fires state-machine events and never sets a state itself; what runs now is ``observe``'s
judgement, never re-derived here. Must not import ``view`` or the public modules: what runs
must not depend on how it is shown.
"""
