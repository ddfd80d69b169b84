"""The phases of bench/proxy.py, one module each, and the proxy report they fill.

``throughput`` (wrk at several concurrencies: sidecar, HAProxy, the origin direct), ``scale``
(thousands of held waits, with and without /metrics), ``goaway`` (POST churn against an origin
that drains every 5th request), ``start`` (exec to ready file, idle RSS), ``longwait`` (first
byte after 3x a relay's idle limit), ``profile`` (where the CPU and the memory go) and
``paired`` (two or more builds side by side). Each phase is a function
``(args, kids, work, sidecar_bin, origin_bin) -> figures`` that ends the children it started;
``table`` turns the figures into the README's rows and ``report`` writes results/proxy.md.

Must not touch go/, bind anything but loopback, or leave a process behind: every child is a
``bench.harness.children.Children``'s and is ended by bench/proxy.py after each phase.
"""

PHASES = ("throughput", "scale", "scale-metrics", "goaway", "start", "longwait", "profile")
# "paired" runs only with --compare and is reported on its own (paired.paired_report).
