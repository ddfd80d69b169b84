"""An ordinary stand-in module: under ``sidecar-fsm exec`` it must still be this file."""

NEMO_GYM_RESERVED_TOP_LEVEL_KEYS = ["sidecar"]
