"""Metrics (``dassl.metrics`` names)."""
from .accuracy import *
