"""Many hosts from one command: a host list (``hostfile``), ssh sessions running the normal
agent (``plan``, ``controller``, ``console``), the pre-flight (``preflight``, ``probe``), the
forwarded environment (``remote_env``) and the remote side's ``lifeline``. Nothing is
re-exported: ``probe`` runs on every host before a job, and should import no more than it
needs."""
