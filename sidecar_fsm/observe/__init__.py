"""The observation layer: what runs now, judged once, for every command that asks.

Owns the verdicts on a recorded run against the machine as it is (``verdicts``: ``Owner``,
``Process``, the identity a signal must match, the proof of a metrics address) and one run
observed whole (``runs``). ``status``, ``top``, ``history``, ``stop``, ``reap`` and the
Prometheus targets all read these, so no two can disagree on what runs: supervisor's lesson, a
judgement re-derived by each caller drifts apart.

Read-only: never writes a row, changes a state or signals a process (``run`` acts on what is
observed here; ``base.procs`` alone signals). May import ``state``, ``config``, ``base`` and
``errors``; must not import ``run``, ``view`` or the public modules, which read it.
"""
