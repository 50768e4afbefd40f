"""The version of the ``vlprompt`` package, in a module that imports nothing, so that any module
of the library (e.g. the results record) reads it without importing the package's top level."""
__version__ = "0.1.0"
