"""Metrics: the catalog of names, the value type, and the collectors that measure them."""
from .catalog import METRICS, MetricSpec
from .value import MetricValue

__all__ = ["METRICS", "MetricSpec", "MetricValue"]
