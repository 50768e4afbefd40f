"""The main functions of ``train.py`` and of the scripts under ``tools/`` (one module per command).

Each module's ``main(argv=None) -> int`` parses its arguments and returns the exit status;
the scripts are thin command lines that call it.
"""
