"""An LMCache KV tier rendered (issue 27 item 1): the connector flag, the ``LMCACHE_*``
variables LMCache reads, the disk tier's emptyDir, and host memory covering the pinned tier;
a plan without a tier renders none of it."""

from __future__ import annotations

from typing import Any

import pytest
from op_samples import make_pool_plan

from kvtune.operator.render.objects import RenderInput, render_pool
from kvtune.tuner.facts import kv_tiers
from kvtune.tuner.plan import PoolPlan
from kvtune.tuner.plan_tier import KVTier, lmcache_config

MiB = 2**20


def _with_tier(tier: KVTier | None, tp: int = 1) -> PoolPlan:
    return make_pool_plan().model_copy(update={"kv_tier": tier, "tensor_parallel": tp})


def _deployment(pool_plan: PoolPlan) -> dict[str, Any]:
    inp = RenderInput(name="agents", namespace="llm", pool="h200", pool_plan=pool_plan,
                      model_name="meta-llama/Llama-3.1-8B-Instruct",
                      image="vllm/vllm-openai:v0.33.0", replicas=1, revision=1)
    objects = render_pool(inp)
    return next(o for o in objects if o["kind"] == "Deployment")


def _pod(pool_plan: PoolPlan) -> dict[str, Any]:
    spec: dict[str, Any] = _deployment(pool_plan)["spec"]["template"]["spec"]
    return spec


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["containers"][0]["env"]}


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_a_plan_without_a_tier_renders_no_lmcache() -> None:
    pod = _pod(_with_tier(None))
    container = pod["containers"][0]
    assert not [n for n in _env(pod) if n.startswith("LMCACHE_")]
    assert not [a for a in container["args"] if a.startswith("--kv-transfer-config")]
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]
    assert "ephemeral-storage" not in container["resources"]["requests"]
    assert "kv_tier" not in make_pool_plan().model_dump()


def test_a_disk_tier_renders_its_connector_variables_volume_and_memory() -> None:
    bare = _pod(_with_tier(None, tp=2))["containers"][0]["resources"]
    tier = KVTier(kind="lmcache-disk", size_gib=400.0, buffer_gib=20.0)
    pod = _pod(_with_tier(tier, tp=2))
    container = pod["containers"][0]
    assert ('--kv-transfer-config={"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
            in container["args"])
    env = _env(pod)
    # LMCache's sizes are per rank: 400 GiB of disk and a 20 GiB buffer over two GPUs.
    assert env["LMCACHE_MAX_LOCAL_DISK_SIZE"] == "200.0"
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "10.0"
    assert env["LMCACHE_LOCAL_CPU"] == "true"
    assert env["LMCACHE_CHUNK_SIZE"] == "256"
    assert env["LMCACHE_LOCAL_DISK"] == "file://" + kv_tiers.LMCACHE_DISK_PATH
    volume = next(v for v in pod["volumes"] if v["name"] == "lmcache-disk")
    assert volume["emptyDir"] == {"sizeLimit": f"{400 * 1024}Mi"}
    mount = next(m for m in container["volumeMounts"] if m["name"] == "lmcache-disk")
    assert mount["mountPath"] == kv_tiers.LMCACHE_DISK_PATH
    resources = container["resources"]
    assert resources["requests"]["ephemeral-storage"] == f"{400 * 1024}Mi"
    assert resources["limits"]["ephemeral-storage"] == f"{400 * 1024}Mi"
    # The buffer is pinned host memory, charged to the pod: memory grows by exactly it, and
    # /dev/shm (vLLM's native tier's home, not LMCache's) stays as it was.
    grew = _mib(resources["requests"]["memory"]) - _mib(bare["requests"]["memory"])
    assert grew == 20 * 1024
    assert resources["limits"]["memory"] == resources["requests"]["memory"]
    assert (pod["volumes"][0]["emptyDir"]["sizeLimit"]
            == _pod(_with_tier(None, tp=2))["volumes"][0]["emptyDir"]["sizeLimit"])


def test_a_cpu_tier_is_pinned_memory_and_no_disk() -> None:
    bare = _mib(_pod(_with_tier(None))["containers"][0]["resources"]["requests"]["memory"])
    pod = _pod(_with_tier(KVTier(kind="lmcache-cpu", size_gib=64.0)))
    container = pod["containers"][0]
    assert _mib(container["resources"]["requests"]["memory"]) - bare == 64 * 1024
    assert _env(pod)["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "64.0"
    assert "LMCACHE_LOCAL_DISK" not in _env(pod)
    assert [v["name"] for v in pod["volumes"]] == ["dshm"]


def test_a_remote_tier_names_its_store_and_serde() -> None:
    tier = KVTier(kind="lmcache-remote", size_gib=1000.0, buffer_gib=8.0,
                  remote_url="lm://lmcache-server.llm.svc:65432")
    env = _env(_pod(_with_tier(tier)))
    assert env["LMCACHE_REMOTE_URL"] == "lm://lmcache-server.llm.svc:65432"
    assert env["LMCACHE_REMOTE_SERDE"] == "naive"
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "8.0"


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"kind": "lmcache-remote", "size_gib": 10.0}, "remote_url=None"),
    ({"kind": "lmcache-cpu", "size_gib": 10.0, "remote_url": "lm://x:1"}, "remote_url="),
    ({"kind": "native-cpu", "size_gib": 10.0}, "kv_offloading_size_gib"),
    ({"kind": "lmcache-tape", "size_gib": 10.0}, "lmcache-disk"),
])
def test_a_wrong_tier_is_refused_in_one_line(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        KVTier(**kwargs)


def test_the_config_file_keys_are_lmcaches_names() -> None:
    tier = KVTier(kind="lmcache-disk", size_gib=100.0, buffer_gib=4.0)
    assert list(lmcache_config(tier, 4)) == [
        "chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size"]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_lmcache_flag_parses_in_vllms_parser_to_its_registered_connector() -> None:
    """vLLM 0.33's own parser reads the rendered ``--kv-transfer-config`` into a
    ``KVTransferConfig`` naming a connector its factory registers, and a config with no
    ``--kv-offloading-size`` keeps it (``_post_init_kv_transfer_config`` only rewrites the
    connector when the size is set)."""
    from dataclasses import field, make_dataclass

    from pydantic.dataclasses import dataclass
    from vllm.config import KVTransferConfig
    from vllm.config.utils import config as vllm_config
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # get_kwargs(VllmConfig) needs a device; a config holding the field alone derives the same
    # argument (its type from the KVTransferConfig hint, as arg_utils adds
    # "--kv-transfer-config" from vllm_kwargs["kv_transfer_config"]).
    # (made, not declared: this module's annotations are strings, get_kwargs needs types)
    holder = vllm_config(dataclass(make_dataclass(
        "Holder", [("kv_transfer_config", KVTransferConfig | None, field(default=None))])))

    flag = next(a for a in _pod(_with_tier(KVTier(kind="lmcache-cpu", size_gib=8.0)))
                ["containers"][0]["args"] if a.startswith("--kv-transfer-config"))
    parser = FlexibleArgumentParser()
    parser.add_argument("--kv-transfer-config", **get_kwargs(holder)["kv_transfer_config"])
    parsed = parser.parse_args([flag]).kv_transfer_config
    config = parsed if isinstance(parsed, KVTransferConfig) else KVTransferConfig(**parsed)
    assert config.kv_connector == "LMCacheConnectorV1"
    assert config.kv_role == "kv_both" and config.is_kv_transfer_instance
    assert "LMCacheConnectorV1" in KVConnectorFactory._registry
