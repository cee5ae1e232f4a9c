__version__ = "0.1.0"  # the one place the package version is kept (setup reads it)
