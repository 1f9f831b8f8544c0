"""The CRD's pins, the status plan fields, the runtime's copy of the plan and the CLI's pin
options all carry exactly the knob table's knobs (kvtune.tuner.knobs), spelled as it says."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from op_samples import SAMPLE_SPEC

from kvtune.cli.main import cli
from kvtune.operator.api import InferenceDeploymentSpec, PinSpec, PlanStatus
from kvtune.operator.rollout import plan as rec  # the rollout's plan stage
from kvtune.runtime.runtime_plan import RuntimeKnobs
from kvtune.tuner.knobs import KNOBS, PINNABLE, camel_name


def _aliases(model: Any) -> dict[str, str]:
    return {name: f.alias or name for name, f in model.model_fields.items()}


def test_the_crd_pins_are_the_pinnable_knobs_in_camel_case() -> None:
    assert {n: a for n, a in _aliases(PinSpec).items()} == {
        k.name: camel_name(k) for k in PINNABLE}


def test_the_status_plan_fields_are_every_knob() -> None:
    assert {n: a for n, a in _aliases(PlanStatus).items()} == {
        k.name: camel_name(k) for k in KNOBS}


def test_the_runtime_reads_every_knob() -> None:
    assert set(RuntimeKnobs.model_fields) == {k.name for k in KNOBS}


def test_the_cli_has_a_pin_option_per_pinnable_knob() -> None:
    help_text = CliRunner().invoke(cli, ["plan", "--help"], terminal_width=200).stdout
    for knob in PINNABLE:
        assert knob.option in help_text, knob.option


def test_every_pin_and_the_cpu_offload_budget_reach_the_planner() -> None:
    spec: dict[str, Any] = {**SAMPLE_SPEC, "tuning": {
        "mode": "auto", "cpuOffloadGiB": 64,
        "pin": {"blockSize": 32, "kvCacheDtype": "fp8", "gpuMemoryUtilization": 0.9,
                "maxModelLen": 32768, "maxNumSeqs": 64, "maxNumBatchedTokens": 4096,
                "enablePrefixCaching": False, "kvOffloadingSizeGiB": 16.0,
                "attentionBackend": "FLASH_ATTN"}}}
    policy = rec.policy_for(InferenceDeploymentSpec.model_validate(spec))
    assert policy.cpu_offload_budget_bytes == 64 * 2**30
    pins = policy.pins.model_dump()
    for knob in PINNABLE:
        if knob.name != "kv_cache_memory_bytes":  # pinned with the fraction: one or the other
            assert pins[knob.name] is not None, knob.name


def test_the_crd_describes_each_pin_from_the_table() -> None:
    schema = PinSpec.model_json_schema(by_alias=True)
    for knob in PINNABLE:
        description = schema["properties"][camel_name(knob)]["description"]
        assert knob.doc in description and f"--{knob.flag}" in description, description
