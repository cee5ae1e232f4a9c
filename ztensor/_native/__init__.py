"""The compiled kernels (``_kernels``, csrc/ through Cython) and their numpy twins
(``fallback``), with the argument ``contract`` and C ``status`` codes both share.
``ztensor.kernels`` chooses between them; nothing else imports this package."""
