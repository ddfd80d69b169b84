"""The view layer: what runs now, and every way of showing it.

Owns the status model (``status``: ``observe``'s verdicts on owners, processes and unrecorded
sidecars, plus live figures and the words for what needs attention), the human tables and
``--json`` shapes (``render``; ``upkeep_report`` for stop, prune and the drain lines;
``reap_report``; ``probe_report`` for ``probe``), reading the proxies' logs (``logs``),
scraping each proxy's ``/metrics`` (``live``), what each sidecar carried as recorded
(``traffic``) and ``top``'s redraw.

Reads only: nothing here changes a state, writes a row or signals a process, and nothing here
decides what runs (``observe`` does). May import ``run``, ``observe``, ``state``, ``base``,
``config`` and ``errors``; must not import the public modules (``cli``, ``launcher``,
``demo``), which call into it.
"""
