"""Device profiles, cost models and calibration (see the README's layout table).

``partitioner`` is imported first: ``cost_models.units`` raises ``partitioner.errors`` exceptions, and
importing ``partitioner`` from inside ``cost_models.profiles`` (as ``from cost_models.profiles import
...`` in a fresh interpreter would) finds ``profiles`` half-initialised.
"""

import partitioner  # noqa: F401 - see the docstring
