"""The view layer: what runs now, and every way of showing it.

Owns the status model (``status``: owner alive, each process ours or gone or reused,
unrecorded sidecars, live figures, what needs attention), the human tables and ``--json``
shapes (``render``; ``upkeep_report`` for stop, prune and the drain lines; ``reap_report``;
``probe_report`` for ``probe``),
reading the proxies' logs (``logs``), scraping each proxy's ``/metrics`` (``live``) and
``top``'s redraw.

Reads only: nothing here changes a state, writes a row or signals a process. May import
``run``, ``state``, ``base``, ``config`` and ``errors``; must not import the public modules
(``cli``, ``launcher``, ``demo``), which call into it.
"""
