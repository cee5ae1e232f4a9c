"""What the ``ztensor`` command runs: the CLI, ``convert`` (and the inputs it
reads), ``stats``."""
