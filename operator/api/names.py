"""The names and labels kvtune gives the objects it renders, said once for every part.

The renderer (``operator/render/objects.py``) writes them; the Prometheus selectors and rules,
the routing objects, the search Jobs and the apply code read them. They live here, under the
API, so that those parts need not import the renderer (``[tool.importlinter]``'s
``operator-layers``)."""

from __future__ import annotations

import hashlib

FIELD_MANAGER = "kvtune"
LABEL_DEPLOYMENT = "kvtune.io/deployment"
LABEL_POOL = "kvtune.io/pool"
LABEL_PLAN_REVISION = "kvtune.io/plan-revision"
LABEL_GPU_CLASS = "kvtune.io/gpu-class"
# spec.pools[].role on a prefill/decode pool's objects and pods; the same value under llm-d's
# key, which its P/D scheduler (llm-d-inference-scheduler's prefill/decode filters) selects on.
LABEL_ROLE = "kvtune.io/role"
LABEL_LLM_D_ROLE = "llm-d.ai/role"
LABEL_METRICS = "kvtune.io/metrics"  # on Services whose pods serve vLLM's /metrics
ANNOTATION_PLAN_HASH = "kvtune.io/plan-hash"
VLLM_PORT = 8000
_MAX_NAME = 63  # Service names are DNS-1035 labels


def object_name(name: str, pool: str) -> str:
    """``<name>-<pool>``, cut to 63 characters with a hash suffix so it stays unique."""
    full = f"{name}-{pool}"
    if len(full) <= _MAX_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    return f"{full[: _MAX_NAME - 9].rstrip('-')}-{digest}"
