"""Method trainers, one module per method; importing this package registers them all.

Every module of this folder is imported, in the order of their names: a new method is a new
file (and its configs), with no list to extend. Names of the trainers are also read from the
source without importing it (``vlprompt_app.project.registered_trainer_names``).
"""
import importlib
import pkgutil

for _module in sorted(info.name for info in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")
