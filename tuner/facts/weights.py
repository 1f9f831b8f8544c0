"""Weights: how vLLM 0.33 loads a model's weights for each weights-dtype choice (the flags that
choice needs, or why vLLM cannot do it), and the weight memory per GPU that follows.

What each choice needs (vLLM 0.33.0, read from the wheel):

- ``auto``: the checkpoint as stored. A ``quantization_config`` is detected by vLLM itself (no
  flag); settings that live only in AutoGPTQ's ``quantize_config.json`` (or AutoAWQ's
  ``quant_config.json``) are read only when ``--quantization gptq`` (``awq``) names the method
  (``get_quant_config``), so that flag is rendered; vLLM refuses GPTQ with activation
  reordering over grouped scales (``desc_act``) and asymmetric GPTQ (``AutoGPTQConfig``); a
  float32 checkpoint is served at bfloat16 (``ModelArchitecture.served_dtype``).
  Methods vLLM 0.33 does not know (bitsandbytes) are refused; deprecated ones (Meta's
  ``fbgemm_fp8`` FP8 releases) need ``--allow-deprecated-quantization``
  (vllm/config/model.py ``_verify_quantization``).
- ``bfloat16`` / ``float16``: a 16-bit (or float32) checkpoint, ``--dtype`` when it differs from
  what ``auto`` gives. A quantized checkpoint cannot be widened; float16 is refused for the
  model types vLLM refuses it for (``_FLOAT16_NOT_SUPPORTED_MODELS``).
- ``fp8``: an FP8 checkpoint as stored, or a 16-bit one quantized at load time with
  ``--quantization fp8_per_tensor`` (0.33's ``fp8`` method no longer quantizes online: it
  raises and names fp8_per_tensor; vllm/model_executor/layers/quantization/fp8.py). Without
  native FP8 (compute capability < 8.9) vLLM runs it through weight-only Marlin kernels.
- ``int8``: an int8 checkpoint as stored; online only for MoE experts
  (``--quantization int8_per_channel_weight_only``: its config has no ``linear`` spec, so dense
  layers stay 16-bit). A dense 16-bit model cannot be served at int8.
- ``int4`` / ``awq`` / ``gptq``: a checkpoint quantized that way; vLLM 0.33 has no online int4.

Memory: quantized checkpoints keep the embedding table and lm_head in 16 bits; everything else
is stored at the quantized width plus its scales (or only the experts, for MXFP4 and online
int8). Tensor parallel shards all weights across ranks; norms are replicated but negligible.

Every GPU also holds vLLM's rotary-embedding table, loaded with the weights and counted in its
"Model loading took" line (``rope_cache_bytes``; the memory budget adds it to the weights,
``planner/budget.non_kv_bytes``, while ``weights_bytes_per_gpu`` stays the parameters a decode
step reads): ``get_rope`` builds one cos/sin cache of ``max_position_embeddings``
x ``rotary_dim`` in the model dtype (vllm/model_executor/layers/rotary_embedding/base.py
``_compute_cos_sin_cache``), shared by all layers and not split by tensor parallel. It is
32 MiB for Llama 3 (131,072 positions) but 2.5 GiB for Llama 4 Scout (10,485,760 positions),
whose logged 53.12 GiB per GPU at TP 4 (vLLM 0.19, H100) is 50.59 GiB of parameters + 2.50 GiB
of this table.

Worked example, Llama 3.3 70B with FP8 weights on one GPU: 70,553,706,496 parameters, of
which 2 * 128,256 * 8,192 = 2,101,346,304 are embedding + lm_head (bf16, 4.2 GB); the other
68.45 B are 1 byte each plus fp32 per-channel scales: about 72.6 GB in all.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.models import CheckpointQuantization, ModelArchitecture

# The 16-bit dtype a model is served at (activations, and KV at kv-cache-dtype auto).
ServedDType = Literal["bfloat16", "float16"]
WeightsDType = Literal["auto", "bfloat16", "float16", "fp8", "int8", "int4", "awq", "gptq"]
WEIGHTS_DTYPES: tuple[str, ...] = (
    "auto", "bfloat16", "bf16", "float16", "fp16", "fp8", "int8", "int4", "awq", "gptq",
)
_ALIASES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}

# vLLM 0.33.0's checkpoint quantization methods (QuantizationMethods in
# vllm/model_executor/layers/quantization/__init__.py, plus the quant_method spellings its
# overrides map onto them); bitsandbytes is not among them any more.
VLLM_CHECKPOINT_METHODS: frozenset[str] = frozenset((
    "awq", "auto_awq", "awq_marlin", "fp8", "fbgemm_fp8", "fp_quant", "modelopt",
    "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed", "auto_gptq", "gptq", "gptq_marlin",
    "compressed-tensors", "experts_int8", "quark", "moe_wna16", "torchao", "inc", "auto-round",
    "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "mxfp8",
))
# DEPRECATED_QUANTIZATION_METHODS: refused unless --allow-deprecated-quantization.
VLLM_DEPRECATED_METHODS: frozenset[str] = frozenset(("fbgemm_fp8", "fp_quant"))
# Online (load-time) quantization names of --quantization (_ONLINE_SHORTHANDS).
ONLINE_FP8 = "fp8_per_tensor"
ONLINE_INT8_EXPERTS = "int8_per_channel_weight_only"
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS ("numerical instability").
FLOAT16_UNSUPPORTED_MODEL_TYPES: frozenset[str] = frozenset(
    ("gemma2", "gemma3", "gemma3_text", "glm4"))

# Scale overhead in bytes per quantized parameter. FP8 per-channel or 128x128 block scales
# (fp32) are < 0.01 B; int4 with group size 128 carries an fp16 scale and zero point per
# group: 4 / 128 = 0.03125 B; MXFP4 one 8-bit scale per 32 values: 1 / 32 = 0.03125 B.
_SCALE_BYTES_PER_PARAM: dict[int, float] = {8: 0.001, 4: 0.03125}


class WeightsLoad(BaseModel):
    """How vLLM loads the weights for one weights-dtype choice, and the flags it needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_dtype: str  # the choice, normalised (bf16 -> bfloat16)
    served_dtype: ServedDType  # activations, and KV at kv-cache-dtype auto
    bits: int  # bits per quantized weight; 16 when nothing is quantized
    experts_only: bool = False  # only the MoE experts are at ``bits``
    method: str | None = None  # the quantization in effect (checkpoint's or online)
    dtype_flag: str | None = None  # --dtype, when it differs from auto's
    quantization_flag: str | None = None  # --quantization (online quantization only)
    allow_deprecated_quantization: bool = False
    note: str = ""  # one sentence: what vLLM does with this choice

    def vllm_args(self) -> list[str]:
        args = [f"--dtype={self.dtype_flag}"] if self.dtype_flag else []
        if self.quantization_flag:
            args.append(f"--quantization={self.quantization_flag}")
        if self.allow_deprecated_quantization:
            args.append("--allow-deprecated-quantization")
        return args


def normalize_weights_dtype(weights_dtype: str) -> str:
    name = _ALIASES.get(weights_dtype.lower(), weights_dtype.lower())
    if name not in WEIGHTS_DTYPES:
        raise InvalidInput(
            "weights_dtype", weights_dtype, f"expected one of {', '.join(WEIGHTS_DTYPES)}")
    return name


def _served_16bit(model: ModelArchitecture) -> ServedDType:
    served = model.served_dtype
    if served == "float16" and model.model_type in FLOAT16_UNSUPPORTED_MODEL_TYPES:
        # vLLM's auto dtype skips float16 for these model types.
        return "bfloat16"
    return served


def weights_load(model: ModelArchitecture, weights_dtype: str) -> WeightsLoad:
    """What vLLM 0.33 does with this weights dtype for this checkpoint. Raises
    ``InvalidInput`` naming the field, the value and the fix when vLLM cannot do it."""
    name = normalize_weights_dtype(weights_dtype)
    q = model.quantization
    if q is not None and q.method not in VLLM_CHECKPOINT_METHODS:
        raise InvalidInput(
            "model.quantization_config.quant_method", q.method,
            f"vLLM 0.33 cannot load {model.hf_id}'s {q.method} weights (its loader for them "
            "was removed); use a 16-bit, FP8, AWQ or GPTQ checkpoint of the model",
        )
    served = _served_16bit(model)
    if q is not None:
        return _load_quantized(model, q, name, weights_dtype, served)
    return _load_16bit_checkpoint(model, name, weights_dtype, served)


def _load_quantized(model: ModelArchitecture, q: CheckpointQuantization, name: str,
                    weights_dtype: str, served: ServedDType) -> WeightsLoad:
    """A pre-quantized checkpoint: vLLM loads it as stored, so the weights dtype asked for
    must be what it stores (``auto``, or its kind)."""
    deprecated = q.method in VLLM_DEPRECATED_METHODS
    _refuse_what_vllm_refuses(model)
    found = (f"vLLM reads {q.config_file} only with --quantization {q.method}"
             if q.config_file else "vLLM detects it from config.json")
    own = WeightsLoad(
        weights_dtype=name, served_dtype=served, bits=q.weight_bits,
        experts_only=q.experts_only, method=q.method,
        quantization_flag=q.method if q.config_file else None,
        allow_deprecated_quantization=deprecated,
        note=(f"{model.hf_id} is stored as {q.method} ({q.weight_bits}-bit"
              f"{' experts' if q.experts_only else ''}); {found}"
              + ("; the method is deprecated in vLLM 0.33 and needs "
                 "--allow-deprecated-quantization" if deprecated else "")),
    )
    is_float8 = q.weight_bits == 8 and (
        "fp8" in q.method or q.method in ("compressed-tensors", "modelopt", "quark"))
    matches = {
        "auto": True,
        "fp8": is_float8,
        "int8": q.weight_bits == 8 and "fp8" not in q.method,
        "int4": q.weight_bits == 4 and not q.experts_only,
        "awq": q.weight_bits == 4 and "awq" in q.method,
        "gptq": q.weight_bits == 4 and "gptq" in q.method,
    }
    if matches.get(name, False):
        return own
    raise InvalidInput(
        "weights_dtype", weights_dtype,
        f"{model.hf_id} is a {q.method} checkpoint ({q.weight_bits}-bit"
        f"{' experts' if q.experts_only else ''}); vLLM loads it as stored and can neither "
        "widen nor requantize it: use weights dtype auto, or a checkpoint stored as "
        f"{name}",
    )


def _load_16bit_checkpoint(model: ModelArchitecture, name: str, weights_dtype: str,
                           served: ServedDType) -> WeightsLoad:
    """A 16- or 32-bit checkpoint: served at 16 bits, or quantized by vLLM at load time."""
    if name in ("auto", "bfloat16", "float16"):
        target = served if name == "auto" else name
        if target == "float16" and model.model_type in FLOAT16_UNSUPPORTED_MODEL_TYPES:
            raise InvalidInput(
                "weights_dtype", weights_dtype,
                f"vLLM refuses float16 for {model.model_type} models (numerical "
                "instability); use bfloat16",
            )
        downcast = model.torch_dtype == "float32"
        return WeightsLoad(
            weights_dtype=name, served_dtype="float16" if target == "float16" else "bfloat16",
            bits=16, dtype_flag=None if target == served else target,
            note=(f"{model.hf_id} is stored as {model.torch_dtype}; vLLM serves it at "
                  f"{target}" + (" (float32 checkpoints are downcast)" if downcast else "")),
        )
    if name == "fp8":
        return WeightsLoad(
            weights_dtype=name, served_dtype=served, bits=8, method=ONLINE_FP8,
            quantization_flag=ONLINE_FP8,
            note=(f"{model.hf_id} is stored as {model.torch_dtype}; vLLM quantizes it to FP8 "
                  f"at load time with --quantization {ONLINE_FP8} (vLLM 0.33's fp8 method "
                  "only loads FP8 checkpoints)"),
        )
    if name == "int8" and model.moe is not None:
        return WeightsLoad(
            weights_dtype=name, served_dtype=served, bits=8, experts_only=True,
            method=ONLINE_INT8_EXPERTS, quantization_flag=ONLINE_INT8_EXPERTS,
            note=(f"vLLM quantizes {model.hf_id}'s MoE experts to int8 at load time "
                  f"(--quantization {ONLINE_INT8_EXPERTS}); attention and dense layers stay "
                  f"{served}"),
        )
    if name == "int8":
        raise InvalidInput(
            "weights_dtype", weights_dtype,
            f"vLLM 0.33 quantizes to int8 at load time only the experts of MoE models; "
            f"{model.hf_id} is dense and stored as {model.torch_dtype}: use fp8, or an int8 "
            "(W8A8 / W8A16) checkpoint of the model",
        )
    raise InvalidInput(
        "weights_dtype", weights_dtype,
        f"{name} weights need a checkpoint quantized that way (vLLM 0.33 does not quantize "
        f"to int4 at load time) and {model.hf_id} is stored as {model.torch_dtype}: point "
        "kvtune at the AWQ/GPTQ checkpoint's config.json, or use fp8",
    )


_GPTQ_METHODS = ("gptq", "auto_gptq", "gptq_marlin")


def _refuse_what_vllm_refuses(model: ModelArchitecture) -> None:
    """GPTQ/AWQ settings vLLM 0.33's AutoGPTQConfig/AutoAWQConfig raise on at start."""
    q = model.quantization
    if q is None:
        return
    where = q.config_file or "config.json:quantization_config"
    if q.missing_settings:
        raise InvalidInput(
            f"{where}:{q.missing_settings[0]}", None,
            f"vLLM 0.33 needs it to load {q.method} weights (its config class reads "
            f"{', '.join(q.missing_settings)} without a default); use the checkpoint's own file")
    if q.method not in _GPTQ_METHODS:
        return
    if q.group_activation_order:
        raise InvalidInput(
            f"{where}:desc_act", True,
            f"vLLM 0.33 no longer serves GPTQ with activation reordering over grouped scales "
            f"(desc_act true, group_size {q.group_size}); use a {model.hf_id} GPTQ checkpoint "
            "quantized with desc_act false (static activation order)")
    if not q.symmetric or q.weight_bits not in (4, 8):
        raise InvalidInput(
            f"{where}:bits/sym", f"{q.weight_bits}/{str(q.symmetric).lower()}",
            "vLLM 0.33 serves symmetric 4- or 8-bit GPTQ only; use such a checkpoint")


def weight_bits(model: ModelArchitecture, weights_dtype: str) -> int:
    """Bits per quantized weight for this dtype (``auto``: the checkpoint's own; float32
    checkpoints are served at 16 bits)."""
    return weights_load(model, weights_dtype).bits


def weights_bytes_total(model: ModelArchitecture, weights_dtype: str) -> int:
    load = weights_load(model, weights_dtype)
    if load.bits >= 16:
        return model.parameter_count * 2
    if load.experts_only:
        quantized = min(model.expert_parameter_count, model.parameter_count)
    else:
        quantized = max(0, model.parameter_count - model.embedding_parameter_count)
        q = model.quantization
        if q is not None and load.method == q.method:
            # Layers the checkpoint left in 16 bits (modules_to_not_convert).
            kept = (q.unquantized_attention_layers * model.attention_parameters_per_layer
                    + q.unquantized_mlp_layers * model.dense_mlp_parameters_per_layer)
            quantized = max(0, quantized - kept)
    per_param = load.bits / 8 + _SCALE_BYTES_PER_PARAM.get(load.bits, 0.0)
    return (model.parameter_count - quantized) * 2 + int(quantized * per_param)


def expert_weights_bytes(model: ModelArchitecture, weights_dtype: str) -> int:
    """Bytes of the routed experts (0 for a dense model): at the quantized width whenever the
    weights are quantized (checkpoints keep attention, not experts, in 16 bits)."""
    load = weights_load(model, weights_dtype)
    if load.bits >= 16:
        return model.expert_parameter_count * 2
    per_param = load.bits / 8 + _SCALE_BYTES_PER_PARAM.get(load.bits, 0.0)
    return int(min(model.expert_parameter_count, model.parameter_count) * per_param)


def rope_cache_bytes(model: ModelArchitecture) -> int:
    """Bytes of vLLM's rotary cos/sin table on each GPU: max_position_embeddings x rotary dim
    (the head dim; MLA's rope part) x 2 B (16-bit). One table: the layers share ``get_rope``'s
    cached instance. Not modelled: a second table for models with two RoPE bases (Gemma 3) and
    the longer tables of YaRN-scaled ropes; both are tens of MiB on the catalog's models."""
    if model.attention_layers == 0:
        return 0  # no attention, no rotary embedding
    rotary_dim = model.mla.qk_rope_head_dim if model.mla is not None else model.head_dim
    return model.max_position_embeddings * rotary_dim * 2


def weights_bytes_per_gpu(
    model: ModelArchitecture, weights_dtype: str, tensor_parallel: int, *,
    data_parallel: int = 1,
) -> int:
    """Bytes of weights on each GPU of a replica of ``tensor_parallel`` x ``data_parallel``
    GPUs: attention, dense layers, shared experts and embeddings split by TP and copied on
    every DP rank; the routed experts split over all ``tp * dp`` GPUs (by experts under
    expert parallel, by tensor slices without: vLLM flattens TP across DP for MoE layers). The
    parameters only: vLLM's "Model loading took" adds ``rope_cache_bytes``."""
    if tensor_parallel < 1:
        raise InvalidInput("tensor_parallel", tensor_parallel, "must be 1 or more")
    if data_parallel < 1:
        raise InvalidInput("data_parallel", data_parallel, "must be 1 or more")
    total = weights_bytes_total(model, weights_dtype)
    if data_parallel == 1:
        return -(-total // tensor_parallel)
    experts = expert_weights_bytes(model, weights_dtype)
    return (-(-(total - experts) // tensor_parallel)
            + -(-experts // (tensor_parallel * data_parallel)))
