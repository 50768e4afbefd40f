"""Name -> class registry (Dassl ``Registry``)."""

__all__ = ["Registry"]


class Registry:
    """Map class names to classes.

    Register with ``@REG.register()`` or ``REG.register(cls)``; the key is
    ``cls.__name__``. ``REG.get(name)`` returns the class.

    Args:
        name (str): registry name used in error messages, e.g. "TRAINER".
    """

    def __init__(self, name):
        self._name = name
        self._obj_map = {}

    def _do_register(self, name, obj, force=False):
        if name in self._obj_map and not force:
            raise KeyError(f'An object named "{name}" was already registered in "{self._name}" registry')
        self._obj_map[name] = obj

    def register(self, obj=None, force=False):
        """Register ``obj``, or return a decorator that registers the class it wraps.

        ``force=True`` replaces an existing entry of the same name instead of raising KeyError.
        """
        if obj is None:

            def wrapper(fn_or_class):
                self._do_register(fn_or_class.__name__, fn_or_class, force=force)
                return fn_or_class

            return wrapper
        self._do_register(obj.__name__, obj, force=force)
        return obj

    def get(self, name):
        """Return the object registered as ``name`` (KeyError if unknown)."""
        if name not in self._obj_map:
            raise KeyError(f'Object name "{name}" does not exist in "{self._name}" registry')
        return self._obj_map[name]

    def registered_names(self):
        """Registered names, in registration order."""
        return list(self._obj_map.keys())

    def __contains__(self, name):
        return name in self._obj_map

    def __len__(self):
        return len(self._obj_map)
