"""Only the C extension lives here; everything else is in pyproject.toml.

The twin's vLLM block pool in C (its speed path, issue #3). Optional: without a C compiler the
install still succeeds and the twin runs its pure-Python pool (the same answers, about half as fast).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefixtune.twin.cache._vllm_pool",
            sources=["operator/prefixtune/twin/cache/_vllm_pool.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
