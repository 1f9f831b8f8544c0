"""Builders for the operator's tests: a hand-made PoolPlan (so rendering is tested without
the planner) and a sample InferenceDeployment spec."""

from __future__ import annotations

from typing import Any

from kvtune.tuner.plan import ExpectedFigures, KVPlan, PoolPlan, Reason

SAMPLE_SPEC: dict[str, Any] = {
    "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
    "workload": {"profile": "chat",
                 "contextTokens": {"p50": 2000, "p95": 8000, "p99": 16000, "max": 32768},
                 "outputTokens": {"p50": 300, "p99": 2000}},
    "slo": {"ttftP95": "2s", "tpotP95": "80ms"},
    "quality": {"lowestKVPrecision": "fp8"},
    "pools": [{"gpuClass": "H200", "replicas": 2, "tensorParallel": 1},
              {"gpuClass": "H100", "replicas": 1, "tensorParallel": 2}],
    "tuning": {"mode": "auto", "pin": {"blockSize": 32}},
    "rollout": {"canaryReplicas": 1, "analysis": "10m"},
}


def make_pool_plan(**knobs: Any) -> PoolPlan:
    plan = {
        "block_size": 32, "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.93,
        "max_model_len": 32768, "max_num_seqs": 192, "max_num_batched_tokens": 8192,
        "enable_prefix_caching": True,
    }
    plan.update(knobs)
    return PoolPlan(
        model_id="meta-llama/Llama-3.1-8B-Instruct", gpu_class="H200", tensor_parallel=1,
        vllm_version="0.33.0", plan=KVPlan(**plan),
        expected=ExpectedFigures(
            kv_bytes_per_token=65536, kv_cache_bytes=100 * 2**30, kv_cache_tokens=1_638_400,
            num_gpu_blocks=51_200, weights_bytes_per_gpu=16 * 2**30,
            non_kv_bytes_per_gpu=20 * 2**30, concurrent_sequences=90,
            concurrent_sequences_context_tokens=18000,
        ),
        reasons=(Reason(knob="kv-cache-dtype", choice="fp8", code="WidestThatMeetsConcurrency",
                        message="bf16 holds 45 sequences at p99, target 64"),),
    )
