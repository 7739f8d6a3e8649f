"""Device profiles and cost models: how long each op and each copy takes, on which device.

The cost modules import ``partitioner.errors`` (and ``partitioner.ir``), and ``partitioner``'s own
``__init__`` imports ``cost_models.profiles``: importing ``partitioner`` first, here, keeps that
cycle in one order whichever package a program imports first.
"""

import partitioner  # noqa: F401  (see the docstring)
