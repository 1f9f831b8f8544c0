"""Facts as data: model architectures (``models``, ``catalog``), GPU classes (``gpus``), what
the pinned vLLM runs (``capabilities``), weights sizes (``weights``) and KV bytes as vLLM lays
pages out (``kvmemory``). Imports nothing from the planner or the simulator."""
