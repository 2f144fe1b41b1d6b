"""The in-script face: ``phalanx.spawn``, ``setup_dist``/``init``, launcher environments, checkpoints."""
