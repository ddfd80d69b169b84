"""The parts every benchmark under bench/ shares, so no benchmark grows its own copy.

``waits`` (one deadline wait, the error a phase fails with), ``children`` (child processes in
their own session, always ended; /proc readings), ``binaries`` (Go builds through the product's
build cache), ``targets`` (the bench origin, a sidecar, HAProxy, wrk), ``http1`` (the asyncio
HTTP/1.1 client the load phases use), ``rounds`` (interleaved wrk rounds of several sidecars,
their medians and noise floor; Go benchmark medians) and ``tables`` (plain-text and markdown
tables, the revision and tool versions a report names). Writing a README section is
``bench.readme``'s.

Must not import a benchmark (bench/proxy.py, bench/metrics.py, ...): they import this.
"""
