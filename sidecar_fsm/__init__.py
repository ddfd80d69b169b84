"""sidecar-fsm: the h2-ping-sidecar proxy's launcher, with every instance a persisted state machine."""

__version__ = "0.1.0"
