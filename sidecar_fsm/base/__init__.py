"""The bottom layer: small leaves every other layer may use.

Process identity and signals (``procs``: the only code that signals a process and the one
place a pid is proven ours), the build cache (``buildcache``, with ``gobuild``: what a build
of the proxy is, shared with the wheel's build hook, and ``gotool``), the ready-file protocol
(``ready``), who can write a path (``trust``), which addresses a process listens on
(``sockets``, through ``procs``), URLs, listen addresses and Go durations (``urls``,
``addresses``, ``gosyntax``), asking many processes at once against one deadline
(``fanout``), config error wording (``configerrors``), how a process ended in words
(``exitstatus``) and where bundled files live (``resources``).

May import only ``sidecar_fsm.errors`` and each other; must not import ``config``, ``state``,
``run``, ``view`` or the public modules: a leaf that reached up would make every layer depend
on every other.
"""
