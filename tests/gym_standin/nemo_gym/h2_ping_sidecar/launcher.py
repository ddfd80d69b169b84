"""Trap: under ``sidecar-fsm exec`` this module is never imported; sidecar_fsm.launcher is."""

raise ImportError("the stand-in's nemo_gym.h2_ping_sidecar.launcher was imported: exec did not redirect it")
