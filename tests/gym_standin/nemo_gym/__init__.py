"""A stand-in for NeMo Gym in the tests of ``sidecar-fsm exec``: not Gym, just its shape.

It has the two modules ``exec`` redirects, as traps that fail loudly when imported (so a test
that reaches them proves the redirect did not happen), one ordinary module that must stay the
stand-in's under ``exec``, and ``env_start``, which does with the sidecar what ``gym env start``
does.
"""
