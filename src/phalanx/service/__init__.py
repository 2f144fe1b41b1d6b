"""The warm service (``--keep-warm``): a template that outlives its launch, per user and per
key, so that the next launch forks its workers instead of importing torch. ``key`` says which
launches share one, ``paths`` where it listens, ``job`` what each worker gets from its own
agent, ``server`` the service's loop, ``entry`` its process, ``client`` how a launch and
``phalanx service`` reach it."""
