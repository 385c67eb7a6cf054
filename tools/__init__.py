"""The repository's maintenance tools, each run as a script (``python tools/NAME.py``); a package so
that a tool split into parts (``tools/matrix/``) imports them as ``tools.*`` everywhere."""
