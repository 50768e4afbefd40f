"""Evaluation (``dassl.evaluation`` names)."""
from .build import *
from .evaluator import *
