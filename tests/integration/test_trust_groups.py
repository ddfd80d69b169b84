"""Group-writable folders judged as Debian's OpenSSH judges them, with real users and groups.

SPEC "Security": a group that holds no other user is no other user. The accounts are made here
(``useradd``/``groupadd``, so root is needed) and removed afterwards: ``alice`` with her private
group, ``bob``, and ``team``, a group of root and bob. A NeMo Gym clone made by alice under
umask 002 (its ``cache/`` and the log dir 0775, group alice) starts as alice, in a real child
process running as her; once bob joins her group the same tree is refused in one line naming
the group, before anything is built or written.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from omegaconf import OmegaConf

from sidecar_fsm.base import trust
from sidecar_fsm.errors import ConfigError, UnusableStateError
from sidecar_fsm.launcher import start_h2_ping_sidecar

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd/groupadd to make the users and groups it judges (CI runs as root)",
)


class Accounts(NamedTuple):
    alice: pwd.struct_passwd
    bob: pwd.struct_passwd
    team_gid: int  # root and bob


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    suffix = f"{os.getpid() % 100000}"
    alice, bob, team = f"sfalice{suffix}", f"sfbob{suffix}", f"sfteam{suffix}"
    made_users: list[str] = []
    made_groups: list[str] = []
    try:
        for user in (alice, bob):
            _run("useradd", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                 "--shell", "/usr/sbin/nologin", user)  # fmt: skip
            made_users.append(user)
        _run("groupadd", team)
        made_groups.append(team)
        _run("gpasswd", "-M", f"root,{bob}", team)
        yield Accounts(pwd.getpwnam(alice), pwd.getpwnam(bob), grp.getgrnam(team).gr_gid)
    finally:
        for user in made_users:  # userdel also removes the user's private group
            subprocess.run(["userdel", user], capture_output=True, timeout=60)
        for group in made_groups:
            subprocess.run(["groupdel", group], capture_output=True, timeout=60)


def _gym_config(log_dir: Path, cache: Path) -> dict[str, object]:
    return {
        "cache_dir": str(cache),
        "policy_model": {"responses_api_models": {"m": {"base_url": "https://localhost:8443/v1"}}},
        "sidecar": {
            "enabled": True,
            "instances": [{"name": "nvcf", "upstream": "https://localhost:8443", "listen": "127.0.0.1:0"}],
            "shutdown_grace": "1s",
            "metrics": False,
            "upstream_check": "off",
            "build_if_missing": True,
            "log_dir": str(log_dir),
        },
    }


# As alice: start and stop the config given as JSON, and report the binary or the error.
AS_USER = r"""
import json, sys
from omegaconf import OmegaConf
from sidecar_fsm.launcher import start_h2_ping_sidecar
try:
    manager = start_h2_ping_sidecar(OmegaConf.create(json.loads(sys.argv[1])))
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "text": str(error)}))
    sys.exit(0)
binary = manager._binary
manager.stop()
print(json.dumps({"binary": binary}))
"""


REPO = Path(__file__).resolve().parents[2]


def _python_for(user: pwd.struct_passwd) -> tuple[str, dict[str, str]]:
    """An interpreter ``user`` can run with this environment's packages, and its environment.

    This one if they can reach it; else (a pyenv under root's 0700 home) the system's Python of
    the same version, given our site-packages and the checkout by PYTHONPATH. Skips, naming why,
    when neither imports the launcher as that user.
    """
    site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [(sys.executable, {}), *(
        (path, {"PYTHONPATH": f"{REPO}{os.pathsep}{site}"})
        for path in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.path.exists(path)
    )]  # fmt: skip
    for python, extra in candidates:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **extra}
        try:
            probe = subprocess.run(
                [python, "-c", "import sidecar_fsm.launcher"], user=user.pw_uid, group=user.pw_gid,
                extra_groups=[], env=env, cwd="/", capture_output=True, timeout=60,
            )  # fmt: skip
        except PermissionError:
            continue
        if probe.returncode == 0:
            return python, env
    pytest.skip(f"no Python interpreter with sidecar-fsm's packages that {user.pw_name} may run")


def _as(user: pwd.struct_passwd, config: dict[str, object], home: Path) -> dict[str, str]:
    python, env = _python_for(user)
    env = {**env, "HOME": str(home)}
    done = subprocess.run(
        [python, "-c", AS_USER, json.dumps(config)],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        umask=0o002,
        env=env,
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def clone(accounts: Accounts, sidecar_binary: Path, cache_dir: Path) -> Iterator[Path]:
    """alice's Gym clone under umask 002 (outside pytest's 0700 folder, so she can reach it):
    ``cache/`` holding the proxy built from these sources, every folder 0775 group alice."""
    top = Path(tempfile.mkdtemp(prefix="sidecar-fsm-clone-"))
    os.chmod(top, 0o755)
    root = top / "Gym"
    copied = root / "cache" / sidecar_binary.relative_to(cache_dir)
    previous = os.umask(0o002)
    try:
        copied.parent.mkdir(parents=True)
        (root / "home").mkdir()
    finally:
        os.umask(previous)
    shutil.copy2(sidecar_binary, copied)
    for path in [root, *root.rglob("*")]:
        os.chown(path, accounts.alice.pw_uid, accounts.alice.pw_gid)
    yield root
    shutil.rmtree(top, ignore_errors=True)


def test_a_gym_clone_made_under_umask_002_starts_as_its_user(accounts: Accounts, clone: Path) -> None:
    cache, log_dir = clone / "cache", clone / "logs"
    assert cache.stat().st_mode & 0o777 == 0o775

    result = _as(accounts.alice, _gym_config(log_dir, cache), clone / "home")

    assert result.get("binary", result) == str(next(cache.rglob("h2-ping-sidecar/*/*/h2-ping-sidecar")))
    # The log dir and its database made under her umask are hers and her group's alone too.
    assert log_dir.stat().st_gid == accounts.alice.pw_gid


def test_a_log_dir_0775_of_a_private_group_is_used(accounts: Accounts, clone: Path) -> None:
    log_dir = clone / "logs"
    log_dir.mkdir(mode=0o775)
    os.chmod(log_dir, 0o775)
    os.chown(log_dir, accounts.alice.pw_uid, accounts.alice.pw_gid)

    result = _as(accounts.alice, _gym_config(log_dir, clone / "cache"), clone / "home")

    assert "binary" in result, result
    assert log_dir.stat().st_mode & 0o777 == 0o775  # used as it is, never changed


def test_once_another_user_joins_the_group_the_cache_is_refused_before_any_build(
    accounts: Accounts, clone: Path
) -> None:
    empty = clone / "empty-cache"
    previous = os.umask(0o002)
    try:
        empty.mkdir()
    finally:
        os.umask(previous)
    os.chown(empty, accounts.alice.pw_uid, accounts.alice.pw_gid)
    group = pwd.getpwuid(accounts.alice.pw_uid).pw_name  # her private group has her name
    _run("gpasswd", "-a", accounts.bob.pw_name, group)
    try:
        result = _as(accounts.alice, _gym_config(clone / "logs", empty), clone / "home")
        cached = _as(accounts.alice, _gym_config(clone / "logs2", clone / "cache"), clone / "home")
    finally:
        _run("gpasswd", "-d", accounts.bob.pw_name, group)

    assert result["error"] == "ConfigError", result
    text = result["text"]
    assert "\n" not in text
    assert f"'{empty}' (owner {group}, group {group}, mode 0775) is writable by group {group}" in text
    assert f"which is not yours alone ({accounts.bob.pw_name})" in text
    assert "chmod go-w" in text  # the fix
    assert list(empty.iterdir()) == []  # no build, no lock, no version memo
    assert cached["error"] == "ConfigError" and f"'{clone / 'cache'}'" in cached["text"], cached
    assert not (clone / "logs").exists() and not (clone / "logs2").exists()


def test_as_root_a_group_with_other_members_is_refused_naming_it(
    accounts: Accounts, tmp_path: Path, sidecar_binary: Path, cache_dir: Path
) -> None:
    team = trust._group_name(accounts.team_gid)
    log_dir = tmp_path / "shared"
    log_dir.mkdir()
    os.chown(log_dir, 0, accounts.team_gid)
    log_dir.chmod(0o775)
    config = OmegaConf.create(_gym_config(log_dir, cache_dir))

    with pytest.raises(UnusableStateError) as caught:
        start_h2_ping_sidecar(config)

    line = str(caught.value)
    assert "\n" not in line
    assert f"'{log_dir}' (owner root, group {team}, mode 0775) is writable by group {team}" in line
    assert f"which is not yours alone ({accounts.bob.pw_name})" in line and "chmod go-w" in line
    assert os.listdir(log_dir) == []

    folder = tmp_path / "bin"
    folder.mkdir()
    binary = folder / "h2-ping-sidecar"
    shutil.copy2(sidecar_binary, binary)
    os.chown(folder, 0, accounts.team_gid)
    folder.chmod(0o770)
    config = OmegaConf.create(_gym_config(tmp_path / "logs", cache_dir))
    config.sidecar.binary = str(binary)
    with pytest.raises(ConfigError, match=f"^sidecar.binary: '{binary}': '{folder}' .*group {team}, "):
        start_h2_ping_sidecar(config)
    assert not (tmp_path / "logs").exists()
