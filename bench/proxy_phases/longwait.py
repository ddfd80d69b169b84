"""Phase 5, the long-wait proof: the first byte comes after 3x the relay's idle limit L; through
the sidecar (PINGs keep the upstream connection busy) none is lost or duplicated, through
HAProxy and HTTP/1.1 over TLS straight through the relay (the control) the relay drops them.

Owns the long-wait figures. Must not leave its processes running.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import subprocess
from pathlib import Path
from typing import Any

from bench.harness.children import Children
from bench.harness.http1 import Outcome, one_shot
from bench.harness.targets import start_haproxy, start_origin, start_sidecar


def phase_longwait(
    args: argparse.Namespace, kids: Children, work: Path, sidecar_bin: Path, origin_bin: Path
) -> dict[str, dict[str, Any]]:
    idle = args.longwait_idle
    wait = 3 * idle
    n = args.longwait_requests
    res: dict[str, dict[str, Any]] = {}
    for who in ("sidecar", "haproxy", "direct"):
        origin = start_origin(kids, origin_bin, work, relay_idle=f"{idle}s")
        ssl_ctx: ssl.SSLContext | None = None
        proc: subprocess.Popen[bytes] | None = None
        if who == "sidecar":
            sc = start_sidecar(
                kids,
                sidecar_bin,
                work,
                origin.relay,
                origin.ca,
                "-ping-interval",
                f"{idle * 0.3:g}s",
                "-ping-timeout",
                f"{idle:g}s",
                name="sidecar-longwait",
            )
            proc, addr = sc.proc, sc.listen
        elif who == "haproxy":
            proc, addr = start_haproxy(
                kids, work, origin.relay, origin.ca, args.haproxy_threads, name="haproxy-longwait"
            )
        else:
            # The control: HTTP/1.1 over TLS straight through the relay; nothing is sent while
            # the origin thinks, so the relay must drop it.
            ssl_ctx = ssl.create_default_context(cafile=origin.ca)
            addr = origin.relay
        origin.reset()

        async def main(addr: str, ssl_ctx: ssl.SSLContext | None) -> Outcome:
            out = Outcome()
            await asyncio.gather(
                *(
                    one_shot(addr, f"/wait?first_byte={wait:g}s&id=w{i}", out, wait + 10, ssl_ctx)
                    for i in range(n)
                )
            )
            return out

        out = asyncio.run(asyncio.wait_for(main(addr, ssl_ctx), timeout=wait + 30))
        st = origin.stats()
        ids = st["by_id"]
        res[who] = {
            "ok": out.ok,
            "n": n,
            "errors": out.errors,
            "lost": sum(1 for i in range(n) if ids.get(f"w{i}", 0) == 0),
            "dup": sum(1 for v in ids.values() if v > 1),
            "relay_drops": st["relay_drops"],
        }
        if proc is not None:
            kids.stop(proc)
        kids.stop(origin.proc)
    return res
