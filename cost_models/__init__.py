"""Device profiles, cost models, training costs and calibration (see the README's Layout table)."""

# cost_models and partitioner import each other (profiles raise partitioner.errors; partitioner
# exports load_profile): importing partitioner first lets either package be imported first.
import partitioner  # noqa: F401  isort: skip
