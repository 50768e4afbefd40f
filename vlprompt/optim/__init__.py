"""Optimizers and learning-rate schedulers (``dassl.optim`` names)."""
from .lr_scheduler import *
from .optimizer import *
