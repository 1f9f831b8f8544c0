"""The knob fields of KVPlan, Pins, PinSpec, PlanStatus and RuntimeKnobs are generated from the
knob table (scripts/gen_knob_fields.py): the generated modules are current, a row is all a new
knob needs, and a plan's dump keeps its order."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvtune.operator.api import PinSpec, PlanStatus, pin_path
from kvtune.operator.rollout.plan import spec_field_names
from kvtune.runtime.runtime_plan import RuntimeKnobs
from kvtune.tuner import knobs
from kvtune.tuner.plan import KVPlan
from kvtune.tuner.planner.policy import Pins

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gen_knob_fields.py"
CLASSES: dict[str, Any] = {"KVPlan": KVPlan, "Pins": Pins, "PinSpec": PinSpec,
                           "PlanStatus": PlanStatus, "RuntimeKnobs": RuntimeKnobs}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_knob_fields", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_knob_fields"] = module
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_the_generated_modules_are_current() -> None:
    assert GEN.stale() == [], "run `make knob-fields` (scripts/gen_knob_fields.py)"
    result = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_changed_row_makes_every_generated_module_stale() -> None:
    """What the currency test catches: a row's bounds and doc changed in the table change
    each module (status carries no bounds, but the doc line)."""
    changed = tuple(dataclasses.replace(k, bounds=(("ge", 2),), pin_bounds=(("ge", 2),),
                                        crd_bounds=(("ge", 2),), doc="KV tokens per block")
                    if k.name == "block_size" else k for k in knobs.FIELD_ORDER)
    for target in GEN.TARGETS:
        text = GEN.render(target, changed)
        assert text != (REPO / target.path).read_text(), target.path
        if target.variant != "status":  # status carries no bounds
            assert "block_size: int" in text and "ge=2" in text, target.path


def test_each_class_has_the_tables_fields_in_dump_order() -> None:
    for target in GEN.TARGETS:
        model = CLASSES[target.owner]
        want = [k.name for k in knobs.FIELD_ORDER
                if k.pinnable or target.variant not in ("pins", "crd")]
        assert list(model.model_fields) == want, target.owner


def test_a_plans_dump_keeps_the_order_it_had_before_the_table() -> None:
    # The plan corpus, stored plans and the CRD's property order rest on this order.
    assert list(KVPlan.model_fields) == [
        "block_size", "kv_cache_dtype", "gpu_memory_utilization", "kv_cache_memory_bytes",
        "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching",
        "kv_offloading_size_gib", "kv_offloading_backend", "attention_backend", "dtype",
        "quantization", "allow_deprecated_quantization"]


def test_a_new_row_becomes_a_typed_field_of_every_class() -> None:
    new = knobs.Knob("kv_cache_chunk_tokens", "kv-cache-chunk", int, "tokens",
                     "a planner-only knob", pinnable=False, bounds=(("gt", 0),))
    order = (*knobs.FIELD_ORDER, new)
    for target in GEN.TARGETS:
        text = GEN.render(target, order)
        fields = [ln.strip() for ln in text.splitlines()
                  if ln.startswith("    ") and not ln.strip().startswith("#")]
        if target.variant in ("pins", "crd"):
            assert not any("kv_cache_chunk_tokens" in f for f in fields), target.owner
        elif target.variant == "status":
            # Optional unless the row says every plan sets it: no KVPlan(...) call must change.
            assert fields[-1] == "kv_cache_chunk_tokens: int | None = None", target.owner
        else:
            assert fields[-1] == (
                "kv_cache_chunk_tokens: int | None = Field(default=None, gt=0)"), target.owner
    required = dataclasses.replace(new, required=True)
    assert GEN.field_line(required, "plan") == "kv_cache_chunk_tokens: int = Field(gt=0)"
    assert GEN.field_line(required, "status") == "kv_cache_chunk_tokens: int"


def test_bounds_and_spellings_come_from_the_row() -> None:
    size = knobs.BY_NAME["kv_offloading_size_gib"]
    assert GEN.field_line(size, "plan") == (
        "kv_offloading_size_gib: float | None = Field(default=None, gt=0.0)")
    # A pin of 0 turns offload off; the CRD spells the unit GiB.
    assert GEN.field_line(size, "pins") == (
        "kv_offloading_size_gib: float | None = Field(default=None, ge=0.0, le=65536.0)")
    assert GEN.field_line(size, "crd").endswith('le=65536.0, alias="kvOffloadingSizeGiB")')
    switch = knobs.BY_NAME["allow_deprecated_quantization"]
    assert GEN.field_line(switch, "plan") == "allow_deprecated_quantization: bool = False"
    dtype = knobs.BY_NAME["kv_cache_dtype"]
    assert GEN.field_line(dtype, "crd") == "kv_cache_dtype: KVCacheDtype | None = None"
    with pytest.raises(ValueError, match="less than or equal to 16777216"):
        Pins(max_model_len=knobs.MAX_PIN_TOKENS + 1)
    with pytest.raises(ValueError, match="greater than 0"):
        RuntimeKnobs.model_validate({"blockSize": 0, "kvCacheDtype": "fp8",
                                     "gpuMemoryUtilization": 0.9, "maxModelLen": 1,
                                     "maxNumSeqs": 1, "maxNumBatchedTokens": 1,
                                     "enablePrefixCaching": True})


def test_a_pins_path_is_spelled_once_from_the_table() -> None:
    assert pin_path("kv_offloading_size_gib") == "spec.tuning.pin.kvOffloadingSizeGiB"
    assert pin_path("max_num_batched_tokens") == "spec.tuning.pin.maxNumBatchedTokens"
    for knob in knobs.PINNABLE:
        alias = PinSpec.model_fields[knob.name].alias
        assert pin_path(knob.name).rsplit(".", 1)[1] == (alias or knobs.camel_name(knob))
    said = spec_field_names(ValueError("pins.kv_offloading_size_gib=3.0: too small; "
                                       "pins.block_size=8 too"))
    assert said == ("spec.tuning.pin.kvOffloadingSizeGiB=3.0: too small; "
                    "spec.tuning.pin.blockSize=8 too")


def test_the_runtime_reads_the_crd_spelling_of_every_knob() -> None:
    plan = KVPlan(block_size=16, kv_cache_dtype="fp8", gpu_memory_utilization=0.9,
                  max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=8192,
                  enable_prefix_caching=True).with_offload(32.0)
    status = PlanStatus.model_validate(plan.model_dump()).model_dump(by_alias=True)
    assert status["kvOffloadingSizeGiB"] == 32.0
    runtime = RuntimeKnobs.model_validate(status)
    assert runtime.model_dump() == plan.model_dump()
    assert runtime.vllm_args() == plan.vllm_args()
