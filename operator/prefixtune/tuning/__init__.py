"""Tuning core: search space, objective, optimizer (skopt) and the pure policy state machine.

- ``settings.TuningSettings``: the plain settings the policy runs under.
- ``space.build_space``: the search space from an adapter's knob specs and the space override.
- ``objective.score``: a measurement window -> Score | InsufficientData.
- ``optimizer.suggest``: the next config from the trial history (skopt rebuilt at every decision).
- ``policy.step``: ``(state, observation, now) -> (state', actions)``; ``state.PolicyState``
  round-trips through JSON; ``actions`` are the data the controller executes.
- ``drive.drive``: the policy run in virtual time against an environment (the benchmark's shell).
"""
