"""Weight memory per GPU from the parameter count and the weight dtype.

Quantized checkpoints (FP8, int4 AWQ/GPTQ) keep the embedding table and lm_head in 16 bits;
everything else is stored at the quantized width plus its scales. Tensor parallel shards all
weights (vocab-parallel embeddings, column/row-parallel linears, experts) across ranks; norms
are replicated but negligible.

Worked example, Llama 3.3 70B with FP8 weights on one GPU: 70,553,706,496 parameters, of
which 2 * 128,256 * 8,192 = 2,101,346,304 are embedding + lm_head (bf16, 4.2 GB); the other
68.45 B are 1 byte each plus fp32 per-channel scales: about 72.6 GB in all.
"""

from __future__ import annotations

from typing import Literal

from kvtune.tuner.errors import InvalidInput
from kvtune.tuner.facts.models import ModelArchitecture

WeightsDType = Literal["auto", "bfloat16", "float16", "fp8", "int8", "int4", "awq", "gptq"]
WEIGHTS_DTYPES: tuple[str, ...] = (
    "auto", "bfloat16", "bf16", "float16", "fp16", "fp8", "int8", "int4", "awq", "gptq",
)

# Scale overhead in bytes per quantized parameter. FP8 per-channel or 128x128 block scales
# (fp32) are < 0.01 B; int4 with group size 128 carries an fp16 scale and zero point per
# group: 4 / 128 = 0.03125 B.
_SCALE_BYTES_PER_PARAM: dict[int, float] = {8: 0.001, 4: 0.03125}


def weight_bits(model: ModelArchitecture, weights_dtype: str) -> int:
    """Bits per quantizable weight for this dtype (``auto``: the checkpoint's own)."""
    name = weights_dtype.lower()
    if name == "auto":
        if model.quantization is not None:
            return model.quantization.weight_bits
        return 32 if model.torch_dtype == "float32" else 16
    if name in ("bfloat16", "bf16", "float16", "fp16", "half"):
        return 16
    if name in ("fp8", "int8"):
        return 8
    if name in ("int4", "awq", "gptq"):
        return 4
    raise InvalidInput(
        "weights_dtype", weights_dtype,
        f"expected one of {', '.join(WEIGHTS_DTYPES)}",
    )


def weights_bytes_total(model: ModelArchitecture, weights_dtype: str) -> int:
    bits = weight_bits(model, weights_dtype)
    if (
        model.quantization is not None
        and bits > model.quantization.weight_bits
    ):
        # A quantized checkpoint is served at its own width; vLLM does not widen it.
        bits = model.quantization.weight_bits
    embed = model.embedding_parameter_count
    body = max(0, model.parameter_count - embed)
    if bits >= 16:
        return model.parameter_count * (bits // 8)
    per_param = bits / 8 + _SCALE_BYTES_PER_PARAM.get(bits, 0.0)
    return embed * 2 + int(body * per_param)


def weights_bytes_per_gpu(
    model: ModelArchitecture, weights_dtype: str, tensor_parallel: int
) -> int:
    """Bytes of weights on each GPU of a tensor-parallel group."""
    if tensor_parallel < 1:
        raise InvalidInput("tensor_parallel", tensor_parallel, "must be 1 or more")
    return -(-weights_bytes_total(model, weights_dtype) // tensor_parallel)
