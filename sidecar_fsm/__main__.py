"""``python -m sidecar_fsm``: the same command as the ``sidecar-fsm`` script."""

from sidecar_fsm.cli import run

run()
