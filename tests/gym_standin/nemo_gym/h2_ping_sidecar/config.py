"""Trap: under ``sidecar-fsm exec`` this module is never imported; sidecar_fsm.config is."""

raise ImportError("the stand-in's nemo_gym.h2_ping_sidecar.config was imported: exec did not redirect it")
