"""The chaos run of ``bench/chaos.py``, small: 2 launchers x 5 lifecycles, SIGKILLs, one reap, the audit.

The same code as the benchmark (launcher processes, the seeded kill schedule, ``sidecar-fsm reap``
as a subprocess, the audit), with the real proxy and the lab's origin. A second test proves the
audit can fail: a stray proxy, a left ready file and a lying row are each reported.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

from helpers import ProcessRegistry, wait_until

from sidecar_fsm.base import procs
from sidecar_fsm.state.store import Store

# bench/ is not installed with the package: the repo root makes it importable however pytest runs.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import chaos  # noqa: E402


def test_a_small_chaos_run_leaves_no_orphan_no_file_and_no_lying_row(
    sidecar_binary: Path, tmp_path: Path
) -> None:
    plan = chaos.ChaosPlan(launchers=2, lifecycles=5, seed=7, kill_every=0.1, time_limit=50.0)
    result = chaos.run_chaos(plan, sidecar_binary, tmp_path)

    assert result.lifecycles == 10, result.table()
    assert result.launcher_kills + result.proxy_kills > 0, "the schedule killed nothing"
    assert result.launcher_errors == []
    assert result.files_left == []
    assert result.inconsistencies == []
    # A launcher killed between a proxy's spawn and the commit that records it leaves a row
    # with no pid: reap must still find that proxy (procs.find_ours) and end it.
    assert result.orphans == []


def test_the_audit_reports_a_stray_proxy_a_left_ready_file_and_a_lying_row(
    sidecar_binary: Path, tmp_path: Path, process_registry: ProcessRegistry
) -> None:
    log_dir = tmp_path / "logs"
    with Store.open(log_dir, host="node7") as store:
        store.create_run("r1", owner_pid=1, owner_start_time=None, config_summary={})
        record = store.create_instance(
            "r1", "policy", "127.0.0.1:0", "https://x.example.com", None, None, None
        )
        store.end_run("r1", "reaped")
        db = store.path
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE instances SET state = 'stopped' WHERE id = ?", [record.id])  # no history row
    conn.close()
    ready = log_dir / "h2ping-stray-node7-r2.ready"
    stray = procs.spawn(
        [
            str(sidecar_binary),
            "-listen",
            "127.0.0.1:0",
            "-upstream",
            "https://127.0.0.1:9",
            "-ready-file",
            str(ready),
        ],
        dict(os.environ),
        str(tmp_path / "stray.log"),
    )
    process_registry.add(stray)
    wait_until(ready.exists, 20, "the stray proxy's ready file")

    orphans, files_left, inconsistencies = chaos.audit(log_dir, os.path.realpath(sidecar_binary), wait=0.2)

    assert orphans == [f"pid {stray.pid}, ready file {ready}: no row has this ready path"]
    assert files_left == [ready.name]
    assert inconsistencies == [
        f"run r1 instance policy (id {record.id}): state stopped but its last history row says configured"
    ]
