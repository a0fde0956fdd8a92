"""Benchmarks: ``prefixtune bench NAME`` runs ``bench/NAME.py``'s ``main`` (see prefixtune.benchcli)."""
