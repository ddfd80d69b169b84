"""The stand-in's sidecar package; its ``launcher`` and ``config`` are traps (see ``nemo_gym``)."""
