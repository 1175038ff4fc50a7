"""Atomic reward primitives: see `primitives.registry`."""
