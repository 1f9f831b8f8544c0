"""KV-cache quantization quality: what fp8, int8, int4 and nvfp4 KV do to a model.

Outside the pure tuner on purpose: the measurement needs torch (and, for checkpoints,
transformers). The layouts (``layouts``, ``minifloat``, ``hadamard``) are numpy only and
reproduce how vLLM 0.33.0 writes each ``--kv-cache-dtype`` into its cache; ``measure`` runs
a model with those layouts applied to its K and V and compares it with 16-bit KV; ``report``
is the plain data that the operator stores and the planner's gate reads.
"""
