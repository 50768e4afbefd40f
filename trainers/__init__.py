"""Method trainers; importing this package registers them all."""
from . import coop, zsclip  # noqa: F401
from . import cocoop, ivlp, kgcoop, maple, promptsrc, vpt  # noqa: F401
from . import dear  # noqa: F401
from . import prograd  # noqa: F401
from . import tcp  # noqa: F401
from . import mma  # noqa: F401
from . import dept  # noqa: F401
from . import mmrl, mmrlpp  # noqa: F401
from . import provp  # noqa: F401
from . import atprompt  # noqa: F401
from . import skip_tuning  # noqa: F401
from . import flyp  # noqa: F401
from . import tac  # noqa: F401
from . import clip_adapter, rada, rada_adapter, rada_fft, rada_prompt, rada_ttt  # noqa: F401
from . import promptkd  # noqa: F401
