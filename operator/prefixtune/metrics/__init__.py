"""Metrics layer: Signals from a real Prometheus or direct scrapes, and the diagnosis."""

from prefixtune.metrics.diagnosis import Diagnosis, Finding, Thresholds, diagnose
from prefixtune.metrics.histogram import Bucket, Slo
from prefixtune.metrics.prometheus_source import PrometheusSource
from prefixtune.metrics.promql import Selector
from prefixtune.metrics.scrape_source import ScrapeSource, Window
from prefixtune.metrics.signals import Signals

__all__ = [
    "Bucket",
    "Diagnosis",
    "Finding",
    "PrometheusSource",
    "ScrapeSource",
    "Selector",
    "Signals",
    "Slo",
    "Thresholds",
    "Window",
    "diagnose",
]
