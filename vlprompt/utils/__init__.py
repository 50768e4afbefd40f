"""General utilities with Dassl's names (``dassl.utils``)."""
from .env import *
from .logger import *
from .meters import *
from .nested import *
from .registry import *
from .tools import *
from .torchtools import *
