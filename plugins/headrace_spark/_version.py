"""The plugin's version, in one place: the distribution's metadata (pyproject.toml) and
``headrace_spark.__version__`` both read it. It moves on its own schedule, not headrace's; the
range of headrace versions it works with is its ``headrace`` requirement in pyproject.toml."""

__version__ = "0.1.0.dev0"
"""The version of the ``headrace-spark`` distribution."""
