__version__ = "0.1.0.dev0"
"""headrace's version, in one place: the distribution's metadata (pyproject.toml) and
headrace itself (``headrace --version``, the CONNECT message, the metrics) read it."""
