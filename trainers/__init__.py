"""Method trainers; importing this package registers them all."""
from . import coop, zsclip  # noqa: F401
from . import dear  # noqa: F401
