"""The fit of kvtune's non-KV memory model to published vLLM start-up logs, and the
prediction of a logged start-up from a set of coefficients (what the leave-one-out in
``bench/memory_calibration.py`` refits and predicts; ``vllm_memory`` ships the full fit).

Each part is fitted on what vLLM logged for that part, so one bad log line moves one
coefficient only:

- activation peak: least squares of the logged torch peak increase on
  [1, logits of each sampler generation, hidden bytes, MoE workspace bytes]
  (``budget.activation_terms``), over rows of a calibrated version whose model shape is known
  and whose peak is the sampler run's (the dense forward-pass term, 3 I + 3 hidden widths per
  token, is derived, not fitted: it reproduces vLLM 0.6's forward-bound profiles, #10517);
- non-torch: the median of the logged non-torch increase at TP = 1 per generation, and the
  median extra at TP > 1;
- CUDA graphs: least squares of vLLM's logged estimate (and, for the versions that measure the
  pool, of the logged actual pool) on [1, layers x graphs past the first of each mode].

Rows marked ``repeat_of`` (the same run again at another max-model-len) are used once.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from kvtune.tuner.errors import KVTuneError
from kvtune.tuner.facts import data_files
from kvtune.tuner.facts.catalog import get_model
from kvtune.tuner.facts.gpus import find_gpu_class
from kvtune.tuner.facts.kvmemory import block_bytes, request_blocks
from kvtune.tuner.facts.models import ModelArchitecture
from kvtune.tuner.facts.vllm_memory import (
    MemoryCoefficients,
    graph_capture_sizes,
    memory_data,
)
from kvtune.tuner.facts.weights import rope_cache_bytes, weights_bytes_per_gpu
from kvtune.tuner.planner import budget

GiB = 1 << 30
# vLLM's defaults on an 80 GB-class GPU for the OpenAI server, which every table row without
# explicit values ran with (the 0.19 logs: "Defaulting max_num_batched_tokens to 8192",
# "Defaulting max_num_seqs to 1024").
DEFAULT_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 1024
# vLLM's default block size on the backends these rows ran (FLASH_ATTN, and the MLA
# backends at 16: DeepSeek-V2-Lite logs 1,505,552 = 94,097 x 16 tokens).
BLOCK_SIZE = 16


class Logged(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    cuda_total_gib: float | None = None
    init_non_torch_gib: float | None = None
    requested_gib: float | None = None
    weights_gib: float | None = None
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    non_kv_gib: float | None = None
    cuda_graph_estimate_gib: float | None = None
    cuda_graph_actual_gib: float | None = None
    available_kv_gib: float | None = None
    kv_tokens: int | None = None


class StartupLog(BaseModel):
    """One row of ``vllm_startup_logs.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    source: str
    source_url: str
    vllm_version: str | None
    version_note: str = ""
    gpu: str | None
    model: str
    shape_of: str | None = None
    shape: dict[str, Any] | None = None
    shape_note: str = ""
    tensor_parallel: int
    pipeline_parallel: int = 1
    dtype: str = "auto"
    weights_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    cuda_graph_deducted: bool = False
    logged: Logged
    derived: dict[str, str] = {}
    repeat_of: str | None = None
    note: str = ""
    quote: tuple[str, ...]

    @property
    def batched_tokens(self) -> int:
        return self.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS

    @property
    def seqs(self) -> int:
        return self.max_num_seqs or DEFAULT_MAX_NUM_SEQS

    def model_arch(self) -> ModelArchitecture | None:
        """The catalog model this row's checkpoint shares a config with, or the config facts
        the row itself carries (``shape.config``), or None."""
        if self.shape_of and self.shape is not None and "quantization_config" in self.shape:
            return _quantized_catalog_model(
                self.shape_of, self.model,
                json.dumps(self.shape["quantization_config"], sort_keys=True))
        if self.shape_of:
            return get_model(self.shape_of)
        if self.shape is not None and "config" in self.shape:
            return _shape_model(self.model, json.dumps(self.shape["config"], sort_keys=True))
        return None

    def model_dtype(self, model: ModelArchitecture) -> str:
        return self.dtype if self.dtype in ("float16", "float32") else model.torch_dtype


@cache
def _quantized_catalog_model(catalog_id: str, hf_id: str, quantization_json: str
                             ) -> ModelArchitecture:
    """A quantized checkpoint of a catalog model: the catalog's config.json and parameter count
    with the checkpoint's quantization_config, as kvtune reads the checkpoint's own config."""
    name = catalog_id.replace("/", "--") + ".json"
    doc = data_files.read_json("data", "models", name)
    config = {**doc["config"], "quantization_config": json.loads(quantization_json)}
    return ModelArchitecture.from_hf_config(
        config, hf_id, parameter_count=doc.get("parameter_count"))


@cache
def _shape_model(hf_id: str, config_json: str) -> ModelArchitecture:
    return ModelArchitecture.from_hf_config(json.loads(config_json), hf_id)


@cache
def startup_logs() -> tuple[StartupLog, ...]:
    doc = data_files.read_json("data", "vllm_startup_logs.json")
    return tuple(StartupLog.model_validate(r) for r in doc["rows"])


def _calibrated(row: StartupLog) -> bool:
    return row.vllm_version in memory_data().versions


def _terms(row: StartupLog) -> budget.ActivationTerms | None:
    model = row.model_arch()
    if model is None:
        return None
    return budget.model_activation_terms(
        model, row.tensor_parallel, row.batched_tokens, row.seqs, row.model_dtype(model))


def _layers(row: StartupLog) -> int | None:
    model = row.model_arch()
    return model.num_hidden_layers if model is not None else None


def _further_graphs(row: StartupLog) -> int:
    """Graphs past the first of each mode (each costs vLLM's per-graph sample)."""
    piecewise, full = graph_capture_sizes(row.seqs, row.batched_tokens)
    return max(0, piecewise - 1) + max(0, full - 1)


def fit(rows: tuple[StartupLog, ...] | list[StartupLog]) -> MemoryCoefficients:
    """The coefficients that best reproduce ``rows``' logged components."""
    versions = memory_data().versions
    usable = [r for r in rows if r.repeat_of is None and r.pipeline_parallel == 1
              and _calibrated(r)]
    samplers = sorted({v.sampler for v in versions.values()})
    a, act_ids = _fit_activation(usable, samplers)
    non_torch, tp_gib, per_peer, nt_ids = _fit_non_torch(usable)
    g, cg_ids = _fit_graphs(usable, lambda r: r.logged.cuda_graph_estimate_gib)
    pool, pool_ids = _fit_graphs(usable, lambda r: r.logged.cuda_graph_actual_gib)

    return MemoryCoefficients(
        activation_base_gib=round(float(a[0]), 5),
        sampler_bytes_per_logit={
            s: round(float(a[1 + i]) * 1.0, 4) for i, s in enumerate(samplers)},
        hidden_state_copies=round(float(a[1 + len(samplers)]), 4),
        moe_workspace_factor=round(float(a[2 + len(samplers)]), 4),
        non_torch_gib=non_torch,
        tensor_parallel_gib=tp_gib,
        tensor_parallel_gib_per_peer=per_peer,
        cuda_graph_base_gib=round(float(g[0]), 5),
        cuda_graph_gib_per_layer_graph=round(float(g[1]), 8),
        cuda_graph_pool_base_gib=round(float(pool[0]), 5),
        cuda_graph_pool_gib_per_layer_graph=round(float(pool[1]), 8),
        fitted_on={"activation": act_ids, "non_torch": nt_ids, "cuda_graphs": cg_ids,
                   "cuda_graph_pools": pool_ids},
        method=(
            "bench/memory_calibration.py --write: least squares of the logged activation on "
            "[1, sampler logits per generation, hidden bytes, MoE workspace bytes] (GiB); "
            "median non-torch at TP=1 per generation; the TP>1 extra's median per TP size, "
            "a line on peer ranks; least squares "
            "of the logged CUDA-graph estimate, and of the logged actual pool, on "
            "[1, layers x graphs past the first of each mode]"
        ),
    )



def _fit_activation(usable: list[StartupLog], samplers: list[str]
                    ) -> tuple[np.ndarray, list[str]]:
    """Least squares of the logged activation on [1, sampler logits per generation, hidden
    bytes, MoE workspace bytes] (GiB), and the rows it used."""
    versions = memory_data().versions
    x_act: list[list[float]] = []
    y_act: list[float] = []
    act_ids: list[str] = []
    for r in usable:
        terms = _terms(r)
        if terms is None or r.logged.activation_gib is None or r.dtype == "float32":
            continue
        if terms.forward_bytes >= 0.9 * r.logged.activation_gib * GiB:
            continue  # the forward pass, not the sampler run, set this row's peak
        sampler = versions[str(r.vllm_version)].sampler
        x_act.append([
            1.0, *(terms.logits / GiB if s == sampler else 0.0 for s in samplers),
            terms.hidden_bytes / GiB, terms.moe_workspace_bytes / GiB,
        ])
        y_act.append(r.logged.activation_gib)
        act_ids.append(r.id)
    a: np.ndarray = np.linalg.lstsq(np.array(x_act), np.array(y_act), rcond=None)[0]
    return a, act_ids


def _fit_non_torch(usable: list[StartupLog]
                   ) -> tuple[dict[str, float], float, float, list[str]]:
    """The median non-torch memory at TP = 1 per generation, the TP > 1 extra (at TP 2, per
    further peer), and the rows used."""
    versions = memory_data().versions
    tp1: dict[str, list[float]] = {}
    tp_extra: dict[int, list[float]] = {}
    nt_ids: list[str] = []
    for r in usable:
        if r.logged.non_torch_gib is None:
            continue
        gen = versions[str(r.vllm_version)].non_torch
        if r.tensor_parallel == 1:
            tp1.setdefault(gen, []).append(r.logged.non_torch_gib)
        else:
            tp_extra.setdefault(r.tensor_parallel, []).append(r.logged.non_torch_gib)
        nt_ids.append(r.id)
    non_torch = {g: round(statistics.median(v), 4) for g, v in sorted(tp1.items())}
    for v in versions.values():  # a generation with no TP = 1 row cannot be calibrated
        non_torch.setdefault(v.non_torch, 0.0)
    # The TP > 1 rows all ran in the "v0.18" generation (0.19.0); the extra is over its TP = 1.
    tp_gib, per_peer = _tensor_parallel_extra(tp_extra, non_torch.get("v0.18", 0.0))
    return non_torch, tp_gib, per_peer, nt_ids


def _fit_graphs(usable: list[StartupLog], logged: Callable[[StartupLog], float | None]
                ) -> tuple[np.ndarray, list[str]]:
    """Least squares of a logged CUDA-graph figure (``logged``: the estimate or the actual
    pool) on [1, layers x graphs past the first of each mode], and the rows used."""
    x: list[list[float]] = []
    y: list[float] = []
    ids: list[str] = []
    for r in usable:
        layers = _layers(r)
        value = logged(r)
        if layers is None or value is None or r.dtype == "float32":
            continue
        x.append([1.0, layers * _further_graphs(r)])
        y.append(value)
        ids.append(r.id)
    coef: np.ndarray = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)[0]
    return coef, ids

def _tensor_parallel_extra(by_tp: dict[int, list[float]], tp1_gib: float) -> tuple[float, float]:
    """(extra at TP 2, extra per further peer rank) of the non-torch increase over TP = 1: the
    median at each TP size, and a line through them on peers (TP - 1) when two sizes were
    logged (one size: flat)."""
    if not by_tp:
        return 0.0, 0.0
    medians = {tp: statistics.median(v) - tp1_gib for tp, v in by_tp.items()}
    if len(medians) == 1:
        return round(next(iter(medians.values())), 4), 0.0
    x = np.array([[1.0, tp - 2.0] for tp in sorted(medians)])
    y = np.array([medians[tp] for tp in sorted(medians)])
    at_2, per_peer = np.linalg.lstsq(x, y, rcond=None)[0]
    return round(float(at_2), 4), round(float(per_peer), 5)


# --- prediction of a logged start-up ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prediction:
    non_kv_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_budget_gib: float
    kv_tokens: int


def predictable(row: StartupLog) -> str | None:
    """Why kvtune cannot predict this row's KV tokens, or None when it can."""
    if row.repeat_of is not None:
        return f"repeats {row.repeat_of}"
    if not _calibrated(row):
        return f"vLLM {row.vllm_version or 'version not stated'} is not calibrated"
    if row.model_arch() is None:
        return "model not in kvtune's catalog"
    if row.shape_of is None and row.logged.weights_gib is None:
        return "model not in kvtune's catalog, and no logged weights to predict with"
    if row.pipeline_parallel != 1:
        return "pipeline parallel (kvtune plans tensor parallel only)"
    if row.dtype == "float32":
        return "--dtype float32 (kvtune plans the checkpoint's dtype)"
    if (row.logged.kv_tokens is None or row.gpu_memory_utilization is None
            or row.max_model_len is None):
        return "KV tokens, utilization or max-model-len not logged"
    if cuda_total_bytes(row) is None:
        return "the GPU's CUDA total is neither logged nor in kvtune's GPU catalog"
    model = row.model_arch()
    assert model is not None
    if row.shape_of is None:
        return None  # predicted with its logged weights (no catalog parameter count)
    try:
        weights_bytes_per_gpu(model, row.weights_dtype, row.tensor_parallel)
    except KVTuneError:
        # A pre-quantized checkpoint (int8/int4) that is not in the catalog itself: kvtune
        # plans such weights only from the checkpoint's own quantization_config.
        return "a quantized checkpoint kvtune does not plan from its 16-bit catalog entry"
    return None


def cuda_total_bytes(row: StartupLog) -> int | None:
    """The row's CUDA total: its GPU class's when kvtune knows the GPU, else the logged one."""
    gpu = find_gpu_class(row.gpu) if row.gpu else None
    if gpu is not None:
        return gpu.cuda_total_bytes
    if row.logged.cuda_total_gib is not None:
        return round(row.logged.cuda_total_gib * GiB)
    return None


def non_kv_parts(
    row: StartupLog, coefs: MemoryCoefficients, weights_bytes: int,
) -> budget.NonKVBytes:
    model = row.model_arch()
    assert model is not None
    gpu = find_gpu_class(row.gpu) if row.gpu else None
    return budget.non_kv_bytes(
        model, weights_bytes, row.tensor_parallel, row.batched_tokens, row.seqs,
        vllm_version=str(row.vllm_version), gpu=gpu, model_dtype=row.model_dtype(model),
        coefs=coefs,
    )


def predict(
    row: StartupLog, coefs: MemoryCoefficients, *, logged_weights: bool = False,
) -> Prediction:
    """vLLM's KV cache for this row as kvtune plans it: the planner's weights (or the logged
    ones), the non-KV model with ``coefs``, vLLM's page layout and its token count."""
    model = row.model_arch()
    total = cuda_total_bytes(row)
    assert model is not None and total is not None and row.gpu_memory_utilization is not None
    assert row.max_model_len is not None
    if (logged_weights or row.shape_of is None) and row.logged.weights_gib is not None:
        # vLLM's figure includes the rotary table, which the budget adds to the parameters.
        weights = round(row.logged.weights_gib * GiB) - rope_cache_bytes(model)
    else:
        weights = weights_bytes_per_gpu(model, row.weights_dtype, row.tensor_parallel)
    parts = non_kv_parts(row, coefs, weights)
    requested = math.ceil(total * row.gpu_memory_utilization)
    kv_budget = requested - parts.total_bytes
    dtype = row.model_dtype(model)
    page = block_bytes(model, row.kv_cache_dtype, row.tensor_parallel, BLOCK_SIZE,
                       model_dtype=dtype)
    blocks = max(0, kv_budget) // page
    per_request = request_blocks(model, row.max_model_len, BLOCK_SIZE, row.batched_tokens,
                                 row.max_model_len)
    return Prediction(
        non_kv_gib=parts.total_bytes / GiB,
        activation_gib=parts.activation_bytes / GiB,
        non_torch_gib=parts.non_torch_bytes / GiB,
        cuda_graph_gib=parts.cuda_graph_bytes / GiB,
        kv_budget_gib=kv_budget / GiB,
        kv_tokens=int(blocks / per_request * row.max_model_len),
    )
