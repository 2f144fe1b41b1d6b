"""One module per ``--rdzv-backend``, each with a ``BACKEND`` (see ``registry``)."""
