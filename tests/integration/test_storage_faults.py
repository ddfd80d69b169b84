"""A log dir or state database that cannot be used, on real filesystems: one line, nothing left.

Each fault is made for real: a file in the path, /proc, a tmpfs mounted read-only or filled up,
a process without permission (a child of root without the capability to override file
permissions, ``setpriv``), a file that is not SQLite, a
corrupt database, one from a newer sidecar-fsm. Each is met through ``Store.open`` (the
launcher's way in) and through ``sidecar-fsm status`` run as a subprocess (the reader's), and
afterwards the file is byte-for-byte and mtime what it was, and nothing new exists. A tmpfs needs
root and a kernel that lets this container mount: where it cannot, the test skips saying why.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import SIDECAR_FSM, fill_filesystem

from sidecar_fsm.errors import SchemaTooNewError, SidecarError, UnusableStateError
from sidecar_fsm.state.fsm import InstanceMachine
from sidecar_fsm.state.store import Store, database_path, open_all_hosts, schema_version

HOST = "node7"
REPO = Path(__file__).resolve().parents[2]
# Root ignores file permissions through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH; a child started
# without them in its bounding set meets the permissions of the directories root owns.
WITHOUT_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every path under ``root``: a file's bytes and mtime in ns, None for a directory.

    A directory's own mtime is left out: SQLite makes and removes its -wal/-shm files beside a
    database it opens, even one it then finds corrupt; what counts is that none is left.
    """
    if not root.exists():
        return {}
    found: dict[str, tuple[bytes, int] | None] = {}
    for path in sorted([root, *root.rglob("*")]):
        found[str(path)] = None if path.is_dir() else (path.read_bytes(), path.lstat().st_mtime_ns)
    return found


def cli_status(log_dir: Path, without_override: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SIDECAR_FSM_HOST": HOST}
    return subprocess.run(
        [
            *(WITHOUT_OVERRIDE if without_override else []),
            str(SIDECAR_FSM),
            "--log-dir",
            str(log_dir),
            "status",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd="/",
    )


def assert_refused_by_cli(log_dir: Path, names: str, without_override: bool = False) -> None:
    """``status`` exits 2 with one line on stderr that names ``names``, and no traceback."""
    result = cli_status(log_dir, without_override)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], result.stderr
    assert "unrecognized" not in lines[0] and "use another --log-dir" in lines[0], result.stderr
    assert result.stdout == ""


def assert_one_line(error: BaseException, path: Path, reason: str) -> None:
    text = str(error)
    assert "\n" not in text
    assert text.startswith(f"{path}: "), text
    assert reason in text, text


def remount(point: Path, option: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{option}", str(point)], check=True)


def made_db(log_dir: Path) -> Path:
    with Store.open(log_dir, host=HOST) as opened:
        opened.create_run("r1", owner_pid=1, owner_start_time=None, config_summary={})
    return database_path(log_dir, HOST)


# -- where the log dir cannot be made ---------------------------------------------------------


def test_a_log_dir_through_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine\n")
    before = snapshot(tmp_path)
    log_dir = blocker / "logs"

    with pytest.raises(UnusableStateError) as refused:
        Store.open(log_dir, host=HOST)
    assert_one_line(refused.value, database_path(log_dir, HOST), f"'{blocker}' is a file, not a directory")
    with pytest.raises(UnusableStateError, match="is a file, not a directory"):
        open_all_hosts(log_dir)
    assert_refused_by_cli(log_dir, str(blocker))
    assert snapshot(tmp_path) == before


def test_a_sidecar_fsm_entry_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "sidecar-fsm").write_text("not a directory\n")
    before = snapshot(tmp_path)

    with pytest.raises(UnusableStateError) as refused:
        Store.open(tmp_path, host=HOST)
    assert_one_line(refused.value, database_path(tmp_path, HOST), "is a file, not a directory; move it away")
    assert_refused_by_cli(tmp_path, str(tmp_path / "sidecar-fsm"))
    assert snapshot(tmp_path) == before


def test_a_log_dir_under_proc() -> None:
    log_dir = Path("/proc/self/sidecar-logs")
    with pytest.raises(UnusableStateError) as refused:
        Store.open(log_dir, host=HOST)
    assert_one_line(refused.value, database_path(log_dir, HOST), "cannot create '/proc/self/sidecar-logs'")
    assert not log_dir.exists()


def test_missing_directories_made_for_a_refused_database_are_removed(make_tmpfs: Callable[..., Path]) -> None:
    point = make_tmpfs("4m")
    filler = fill_filesystem(point)
    before = snapshot(point)
    # The directories can be made on a full tmpfs (they cost no data pages); the database cannot.
    with pytest.raises(UnusableStateError) as refused:
        Store.open(point / "a" / "b", host=HOST)
    assert_one_line(refused.value, database_path(point / "a" / "b", HOST), "filesystem is full")
    assert snapshot(point) == before
    filler.unlink()


# -- permissions and read-only or full filesystems --------------------------------------------


def open_without_override(log_dir: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from sidecar_fsm.errors import SidecarError\n"
        "from sidecar_fsm.state.store import Store\n"
        "try:\n"
        f"    Store.open({str(log_dir)!r}, host={HOST!r}).close()\n"
        "except SidecarError as error:\n"
        "    print(type(error).__name__, error)\n"
        "    sys.exit(3)\n"
    )
    return subprocess.run(
        [*WITHOUT_OVERRIDE, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd="/",
        timeout=60,
    )


def test_no_permission_to_make_the_log_dir_or_write_the_database(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to drop the permission override")
    fresh = tmp_path / "fresh"
    fresh.mkdir(mode=0o555)
    before = snapshot(tmp_path)
    result = open_without_override(fresh)
    assert result.returncode == 3, (result.stdout, result.stderr)
    db = database_path(fresh, HOST)
    assert result.stdout == f"UnusableStateError {db}: permission denied; use another --log-dir\n"
    assert snapshot(tmp_path) == before

    existing = tmp_path / "existing"
    db = made_db(existing)
    (existing / "sidecar-fsm").chmod(0o555)
    before = snapshot(tmp_path)
    result = open_without_override(existing)
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stdout == f"UnusableStateError {db}: permission denied; use another --log-dir\n"
    # A reader must create the WAL index beside the file, which this process may not do here.
    assert_refused_by_cli(existing, str(db), without_override=True)
    (existing / "sidecar-fsm").chmod(0o300)  # not even listed
    assert_refused_by_cli(existing, str(existing / "sidecar-fsm"), without_override=True)
    (existing / "sidecar-fsm").chmod(0o755)
    assert snapshot(tmp_path) == before


def test_a_read_only_filesystem(make_tmpfs: Callable[..., Path]) -> None:
    empty = make_tmpfs("1m")
    remount(empty, "ro")
    with pytest.raises(UnusableStateError) as refused:
        Store.open(empty / "logs", host=HOST)
    assert_one_line(refused.value, database_path(empty / "logs", HOST), "read-only filesystem")

    point = make_tmpfs("4m")
    db = made_db(point)
    # A copy taken while a writer had commits in its WAL, as a crash leaves it.
    stale = point / "stale" / "sidecar-fsm"
    stale.mkdir(parents=True)
    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE runs SET outcome = 'ended', ended_at = 2.0")
        writer.commit()
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{db}{suffix}", f"{stale / db.name}{suffix}")
    finally:
        writer.close()
    remount(point, "ro")
    before = snapshot(point)
    with pytest.raises(UnusableStateError) as refused:
        Store.open(point, host=HOST)
    assert_one_line(refused.value, db, "read-only filesystem; use another --log-dir")
    # Reading needs no write: a log dir mounted read-only after a job can still be inspected.
    result = cli_status(point)
    assert result.returncode == 0 and "r1" in result.stdout, (result.stdout, result.stderr)
    with Store.open_existing(db) as reader:
        assert [run.run_id for run in reader.list_runs()] == ["r1"]
    # Unless commits wait in a WAL that only a writable mount lets SQLite read: refused, not missed.
    with pytest.raises(UnusableStateError) as refused:
        Store.open_existing(stale / db.name)
    assert_one_line(refused.value, stale / db.name, "read-only filesystem with a WAL still beside")
    assert snapshot(point) == before


def test_a_full_filesystem_refuses_a_new_or_existing_database(make_tmpfs: Callable[..., Path]) -> None:
    point = make_tmpfs("4m")
    db = made_db(point / "old")
    filler = fill_filesystem(point)
    before = snapshot(point)

    for log_dir in (point / "new", point / "old"):
        with pytest.raises(UnusableStateError) as refused:
            Store.open(log_dir, host=HOST)
        assert_one_line(refused.value, database_path(log_dir, HOST), "filesystem is full")
    assert snapshot(point) == before
    filler.unlink()
    with Store.open(point / "old", host=HOST) as reopened:
        assert reopened.path == db and reopened.get_run("r1") is not None


def test_a_full_filesystem_during_a_run_rolls_the_transition_back(make_tmpfs: Callable[..., Path]) -> None:
    point = make_tmpfs("8m")
    with Store.open(point, host=HOST) as opened:
        opened.create_run("r", owner_pid=1, owner_start_time=None, config_summary={})
        instances = [
            opened.create_instance("r", f"i{k}", "127.0.0.1:0", "https://x.example.com", None, None, None)
            for k in range(2000)
        ]
        filler = fill_filesystem(point)
        failure: SidecarError | None = None
        machine = None
        # Each commit appends to the WAL until there is no page left for it; bounded by the count.
        for record in instances:
            machine = InstanceMachine(opened, record.id)
            try:
                machine.fire("build", detail="x" * 2000)
            except SidecarError as error:
                failure = error
                break
        assert failure is not None and machine is not None, "the full filesystem never refused a write"
        assert_one_line(failure, opened.path, "write rolled back: filesystem is full")
        # Nothing of the failed transition was stored; the machine did not move.
        assert machine.state == "configured"
        filler.unlink()
        conn = sqlite3.connect(opened.path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            moved = conn.execute("SELECT count(*) FROM instances WHERE state = 'building'").fetchone()[0]
            history = conn.execute("SELECT count(*) FROM transitions").fetchone()[0]
        finally:
            conn.close()
        assert moved == history
        # With space again the same store goes on, and the refused transition can be made.
        machine.fire("build")
        assert machine.state == "building"


# -- files that are not a database of ours ----------------------------------------------------


def corrupt_first_page(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100:4096] = bytes((i * 37) % 251 for i in range(3996))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda path: path.write_bytes(b'{"these": "are my notes"}\n' * 20), "not a SQLite database"),
        (lambda path: path.write_bytes(path.read_bytes()[:4200]), "database file is corrupt"),
        (corrupt_first_page, "database file is corrupt"),
    ],
    ids=["not-sqlite", "truncated", "corrupt-schema-page"],
)
def test_a_file_that_is_not_a_usable_database(
    tmp_path: Path, make: Callable[[Path], None], reason: str
) -> None:
    db = made_db(tmp_path)
    make(db)
    os.utime(db, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = snapshot(tmp_path)

    with pytest.raises(UnusableStateError) as refused:
        Store.open(tmp_path, host=HOST)
    assert_one_line(refused.value, db, reason)
    with pytest.raises(UnusableStateError):
        open_all_hosts(tmp_path)
    assert_refused_by_cli(tmp_path, str(db))
    assert snapshot(tmp_path) == before


def test_a_sqlite_file_of_another_program(tmp_path: Path) -> None:
    db = database_path(tmp_path, HOST)
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = snapshot(tmp_path)

    with pytest.raises(UnusableStateError) as refused:
        Store.open(tmp_path, host=HOST)
    assert_one_line(refused.value, db, "not a sidecar-fsm database (it has tables notes)")
    assert_refused_by_cli(tmp_path, str(db))
    assert snapshot(tmp_path) == before


def test_a_newer_schema_through_the_cli(tmp_path: Path) -> None:
    db = made_db(tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {schema_version() + 1}")
    conn.close()
    before = snapshot(tmp_path)
    with pytest.raises(SchemaTooNewError):
        Store.open(tmp_path, host=HOST)
    assert_refused_by_cli(tmp_path, str(db))
    assert snapshot(tmp_path) == before


def test_corruption_found_by_a_later_read_is_one_line(tmp_path: Path) -> None:
    db = made_db(tmp_path)
    schema_end = db.stat().st_size
    with Store.open(tmp_path, host=HOST) as opened:
        opened.create_run("r2", owner_pid=1, owner_start_time=None, config_summary={"pad": "x" * 20000})
    data = bytearray(db.read_bytes())
    # The schema's pages (page 1 and, since the query views, overflow pages after the tables'
    # roots) stay sound, so the file opens; the pages the new run added behind them are garbage.
    data[schema_end:] = bytes((i * 53) % 251 for i in range(len(data) - schema_end))
    db.write_bytes(bytes(data))
    with Store.open_existing(db) as opened, pytest.raises(UnusableStateError) as refused:
        opened.list_runs()
    assert_one_line(refused.value, db, "read failed: database file is corrupt")
