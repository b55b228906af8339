"""Shared kernel: types, errors, settings helpers, telemetry and the KV store protocol.

Everything else may import from here; this package imports nothing of FleetGate's.
"""
