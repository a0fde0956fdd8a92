"""prefixtune: a Kubernetes operator that tunes the prefix cache of LLM serving engines online."""

__version__ = "0.1.0"
