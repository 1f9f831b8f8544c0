"""kvtune: tunes the vLLM KV cache per model and per GPU class from observed traffic.

The real code lives in the top-level folders (see pyproject's package-dir):
``tuner/`` is ``kvtune.tuner`` (pure planning: ``facts``, ``planner``, ``simulator``),
``operator/`` is ``kvtune.operator`` (the Kubernetes edge), ``replay/`` is ``kvtune.replay``,
``cli/`` is ``kvtune.cli``, ``e2e/`` is ``kvtune.e2e`` and ``runtime_images/entrypoint/`` is
``kvtune.runtime`` (README: the folder -> import name table).
"""

__version__ = "0.1.0"
