"""Liveness: heartbeats judged on the coordinator's clock, probes, adaptive cadence,
reassignment of an OFFLINE agent's tasks, registration slots and quarantine."""
