"""What users look at: ``prefixtune status``, ``prefixtune report`` and ``prefixtune twin whatif``.

``status_view`` formats ServingDeployments for the terminal, ``report`` writes an offline HTML report
with PNG plots, ``whatif`` sweeps knobs through the digital twin, ``plots`` draws the PNGs (matplotlib,
Agg backend) and ``cluster`` is the only module that talks to the API server.
"""
