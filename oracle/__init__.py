"""vLLM's own scheduler as the oracle of kvtune's simulator (``kvtune.oracle``).

Optional: needs the ``kvtune[vllm]`` extra (vLLM 0.33.0 and torch). Only this package, the
differential tests and ``kvtune simulate --engine vllm`` (which imports it lazily) touch
vLLM; the tuner never imports it (a code-quality test checks that).

- ``tokens``: a simulator request's segments as token ids that vLLM's block hasher sees alike
  exactly where kvtune's prefix keys are equal (pure).
- ``steps``: what one engine step did, recorded the same way from either engine (pure), and
  the kvtune side of the recording.
- ``vllm_engine``: vLLM's ``Scheduler`` / ``AsyncScheduler`` built from an ``EngineConfig``
  and driven the way vLLM's engine core drives it (the two-deep batch queue when async),
  under kvtune's step-time model.
"""
