"""kvtune: tunes the vLLM KV cache per model and per GPU class from observed traffic.

The real code lives in the top-level folders (see pyproject's package-dir):
``tuner/`` is ``kvtune.tuner`` (pure planning), ``operator/`` is ``kvtune.operator`` (the
Kubernetes edge), ``cli/`` is ``kvtune.cli`` and ``e2e/`` is ``kvtune.e2e``.
"""

__version__ = "0.1.0"
