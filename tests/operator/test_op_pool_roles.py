"""Prefill/decode pools (issue 26 item 3, the operator's side): the pair is planned together,
checked as vLLM 0.33's NixlConnector handshake checks it before anything rolls out, refused in
one line naming the spec's field, the two values and the fix, and each role's Deployment
carries its ``--kv-transfer-config``."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from bad_specs import _DECODE, _PREFILL, BASE

from kvtune.operator.api import InferenceDeploymentSpec, pair_of
from kvtune.operator.api.workloads import declared_profile
from kvtune.operator.render.objects import RenderInput, plan_hash, render_pool, vllm_args
from kvtune.operator.rollout import role_plan
from kvtune.operator.rollout.plan import plan_one_pool, planning_inputs, policy_for
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.plan import PoolPlan

LLAMA70 = "meta-llama/Llama-3.3-70B-Instruct"


def _spec(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
          model: str = LLAMA70) -> InferenceDeploymentSpec:
    raw = copy.deepcopy(BASE)
    raw["model"] = {"name": model}
    raw["pools"] = [{**_PREFILL, "gpuClass": "H200", "tensorParallel": 2, **(prefill or {})},
                    {**_DECODE, "gpuClass": "H200", "tensorParallel": 4, **(decode or {})}]
    return InferenceDeploymentSpec.model_validate(raw)


def _plans(spec: InferenceDeploymentSpec) -> tuple[PoolPlan, PoolPlan]:
    model = get_model(spec.model.name)
    profile, policy = declared_profile(spec.workload), policy_for(spec)
    p, d = (plan_one_pool(spec, pool, model, profile, policy) for pool in spec.pools)
    return p, d


def test_the_pair_is_found_from_either_pool() -> None:
    spec = _spec()
    pre, dec = spec.pools
    assert pair_of(spec.pools, pre) == (pre, dec) == pair_of(spec.pools, dec)


def test_each_role_is_planned_at_its_tp_and_the_pair_shares_what_the_handshake_compares(
        ) -> None:
    prefill, decode = _plans(_spec())
    assert (prefill.tensor_parallel, decode.tensor_parallel) == (2, 4)
    for knob in ("block_size", "kv_cache_dtype", "attention_backend"):
        assert getattr(prefill.plan, knob) == getattr(decode.plan, knob), knob


def test_a_prefill_pin_is_followed_by_the_decode_pool() -> None:
    """A pin on one role that the other leaves open holds on both (vLLM needs them equal)."""
    prefill, decode = _plans(_spec(prefill={"pin": {"blockSize": 64}}))
    assert prefill.plan.block_size == decode.plan.block_size == 64


@pytest.mark.parametrize(("prefill", "decode", "needles"), [
    ({"pin": {"blockSize": 32}}, {"pin": {"blockSize": 16}},
     ("blockSize='prefill 32, decode 16'", "pin pools[].pin.blockSize 32 on both roles")),
    ({"pin": {"kvCacheDtype": "fp8"}}, {"pin": {"kvCacheDtype": "auto"}},
     ("kvCacheDtype='prefill fp8, decode auto'", "pools[].pin.kvCacheDtype")),
    # Llama-3.3-70B has 8 KV heads: a prefill TP above them replicates KV decode cannot read.
    ({"tensorParallel": 8}, {"tensorParallel": 4}, ()),
])
def test_a_pair_the_handshake_refuses_is_refused_in_one_line(
        prefill: dict[str, Any], decode: dict[str, Any], needles: tuple[str, ...]) -> None:
    spec = _spec(prefill, decode)
    if not needles:  # TP8 over TP4 with 8 KV heads is accepted by the handshake
        p, d = _plans(spec)
        assert (p.tensor_parallel, d.tensor_parallel) == (8, 4)
        return
    with pytest.raises(role_plan.PairRefused) as refused:
        _plans(spec)
    message = str(refused.value)
    assert "\n" not in message and "NixlConnector" in message
    for needle in needles:
        assert needle in message, message


def test_prefill_tp_above_the_kv_heads_over_a_smaller_decode_tp_is_refused() -> None:
    """Qwen3-30B-A3B has 4 KV heads: at prefill TP 8 its KV is replicated, which a decode
    TP of 2 cannot read (the handshake's assert); refused before rollout."""
    spec = _spec({"tensorParallel": 8}, {"tensorParallel": 2}, model="Qwen/Qwen3-30B-A3B")
    with pytest.raises(role_plan.PairRefused, match=r"tensorParallel='prefill 8, decode 2'.*"
                       r"lower prefill TP to 4"):
        _plans(spec)


def _render(spec: InferenceDeploymentSpec, plans: tuple[PoolPlan, PoolPlan]
            ) -> list[RenderInput]:
    return [RenderInput(name="bot", namespace="llm", pool=pool.pool_name, pool_plan=plan,
                        model_name=spec.model.name, image="vllm/vllm-openai:v0.33.0",
                        replicas=1, revision=1, role=pool.role)
            for pool, plan in zip(spec.pools, plans, strict=True)]


def test_each_roles_deployment_carries_its_kv_transfer_config_and_role_labels() -> None:
    spec = _spec()
    for inp in _render(spec, _plans(spec)):
        deployment = next(o for o in render_pool(inp) if o["kind"] == "Deployment")
        pod = deployment["spec"]["template"]
        args = pod["spec"]["containers"][0]["args"]
        flags = [a for a in args if a.startswith("--kv-transfer-config=")]
        assert len(flags) == 1
        kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[inp.role or ""]
        assert json.loads(flags[0].split("=", 1)[1]) == {"kv_connector": "NixlConnector",
                                                         "kv_role": kv_role}
        assert f"--tensor-parallel-size={inp.pool_plan.tensor_parallel}" in args
        for labels in (deployment["metadata"]["labels"], pod["metadata"]["labels"]):
            assert labels["kvtune.io/role"] == labels["llm-d.ai/role"] == inp.role


def test_a_pool_without_a_role_renders_no_transfer_and_keeps_its_hash() -> None:
    spec = _spec()
    inp = _render(spec, _plans(spec))[1]
    plain = RenderInput(**{**inp.__dict__, "role": None})
    assert not any(a.startswith("--kv-transfer-config") for a in vllm_args(plain))
    assert plan_hash(inp.pool_plan, inp.image) == plan_hash(inp.pool_plan, inp.image, None)
    assert plan_hash(inp.pool_plan, inp.image, "decode") != plan_hash(inp.pool_plan, inp.image)


def test_the_planning_digest_follows_the_peers_pin() -> None:
    """A pin on the prefill pool changes the decode pool's plan: its digest must change."""
    model = get_model(LLAMA70)
    a, b = _spec(), _spec(prefill={"pin": {"blockSize": 64}})
    digests = [planning_inputs(s, s.pools[1], model, declared_profile(s.workload),
                               policy_for(s), None)
               for s in (a, b)]
    assert digests[0] != digests[1]


@pytest.mark.vllm
def test_the_rendered_transfer_configs_parse_in_vllms_parser() -> None:
    """Each role's rendered ``--kv-transfer-config`` parses in vLLM 0.33's own parser into a
    ``KVTransferConfig`` of its role (the engine's field type; the whole VllmConfig needs a
    device)."""
    from dataclasses import field, make_dataclass

    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.engine.arg_utils import get_kwargs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    holder = make_dataclass("Holder", [("kv_transfer_config", KVTransferConfig | None,
                                        field(default=None))])
    parser = FlexibleArgumentParser()
    parser.add_argument("--kv-transfer-config", **get_kwargs(holder)["kv_transfer_config"])
    spec = _spec()
    for inp in _render(spec, _plans(spec)):
        flag = [a for a in vllm_args(inp) if a.startswith("--kv-transfer-config")]
        config = parser.parse_args(flag).kv_transfer_config
        assert isinstance(config, KVTransferConfig)
        assert config.is_kv_producer == (inp.role == "prefill")
        assert config.is_kv_consumer == (inp.role == "decode")


def test_a_roles_own_pin_over_the_specs_pin_is_honoured_not_refused() -> None:
    """``pools[].pin`` overrides ``tuning.pin`` for its role: the pin check reads the two
    together (before, a role's blockSize 64 over a spec's 32 was refused as unhonoured)."""
    from kvtune.operator.rollout import plan_checks

    raw = _spec(decode={"pin": {"blockSize": 64}}).model_dump(by_alias=True,
                                                               exclude_none=True)
    raw["tuning"]["pin"] = {"blockSize": 32}
    spec = InferenceDeploymentSpec.model_validate(raw)
    prefill, decode = _plans(spec)
    assert (prefill.plan.block_size, decode.plan.block_size) == (32, 64)
    profile = declared_profile(spec.workload)
    for pool, plan in zip(spec.pools, (prefill, decode), strict=True):
        assert plan_checks.check(spec, plan, profile, pool.pin) is None
    refused = plan_checks.check(spec, decode, profile)
    assert refused is not None and "spec.tuning.pin.blockSize=32" in refused[1]
    bad = decode.model_copy(update={"plan": decode.plan.model_copy(update={"block_size": 16})})
    refused = plan_checks.check(spec, bad, profile, spec.pools[1].pin)
    assert refused is not None and "spec.pools[].pin.blockSize=64" in refused[1]
