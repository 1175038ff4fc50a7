"""Test-wide setup: 8 fake CPU devices so sharding tests run on any machine.

The device count is forced whatever else XLA_FLAGS holds (chex replaces only that flag), and
JAX runs on the CPU unless JAX_PLATFORMS says otherwise; `test_parallel.py` then runs its cases
in a subprocess on 8 CPU devices, so nothing is silently skipped.
"""

import os

import chex

chex.set_n_cpu_devices(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
