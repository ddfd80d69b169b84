"""``python -m nemo_gym.env_start CONFIG.yaml [--exit N]``: the sidecar part of ``gym env start``.

Like Gym: load the config, ``start_h2_ping_sidecar(cfg)`` (which rewrites model base URLs in
place), let a model server call its upstream through the rewritten URL, poll ``check()`` until
Ctrl-C, then ``stop()``. The "model server" is one HTTP/1.1 request to
``<policy_model.responses_api_models.m.base_url><path>``, standing in for aiohttp.

Prints one ``key: value`` line per fact for the test to read: ``pid``, ``url``, ``response``,
``serving``, ``stopped``. With ``--exit N`` it stops and exits N after the request; otherwise it
serves until SIGINT, stops the sidecars, then dies of SIGINT itself as a Python program would.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import urllib.request

from omegaconf import OmegaConf

from nemo_gym.h2_ping_sidecar.launcher import SidecarError, start_h2_ping_sidecar


def _say(key: str, value: object) -> None:
    print(f"{key}: {value}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("--path", default="/echo")
    parser.add_argument("--exit", type=int, default=None)
    args = parser.parse_args()

    _say("pid", os.getpid())
    cfg = OmegaConf.load(args.config)
    manager = start_h2_ping_sidecar(cfg)
    if manager is None:
        _say("error", "sidecar not enabled")
        return 1
    try:
        url = cfg.policy_model.responses_api_models.m.base_url + args.path
        _say("url", url)
        with urllib.request.urlopen(url, timeout=60) as response:
            body = response.read().decode(errors="replace").splitlines()[0]
            _say("response", f"{response.status} {body}")
        if args.exit is not None:
            return args.exit
        _say("serving", "until SIGINT")
        while True:
            manager.check()
            time.sleep(0.1)
    except KeyboardInterrupt:
        manager.stop()
        _say("stopped", "SIGINT")
        # Die of the signal, as an unhandled Ctrl-C would, so the caller sees how we ended.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except SidecarError as error:
        _say("error", str(error).splitlines()[0])
        return 1
    finally:
        manager.stop()
        _say("stopped", "finally")


if __name__ == "__main__":
    sys.exit(main())
