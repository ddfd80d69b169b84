"""``python -m sidecar_fsm``: the same command as the ``sidecar-fsm`` script."""

import sys

from sidecar_fsm.cli import main

sys.exit(main())
