"""Measure what each quantized KV dtype does to a model, with torch and transformers.

For each calibration prompt the model runs once with 16-bit KV (its own activation dtype)
and once per dtype with every layer's K and V replaced by what vLLM 0.33.0 would store and
read back (``quality.layouts``, applied after RoPE, where vLLM writes its cache). Figures:

- per-layer attention-output error: in the 16-bit pass, each layer's attention is also
  computed with only that layer's K/V (and Q where the backend quantizes it) in the dtype;
  ‖o_dtype − o_16bit‖ / ‖o_16bit‖ over all prompts. Both sides in float32, so the figure is
  the quantization's alone.
- next-token KL(16-bit ‖ dtype) in nats at every prompt position and top-1 agreement, from
  the whole model run with the dtype in all layers (errors compound through the layers).

Attention runs through a registered transformers attention function in float32 for the
16-bit and the quantized runs alike (vLLM's kernels accumulate in fp32 too), so the only
difference between the runs is the KV cache's dtype.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kvtune.quality import checkpoint, layouts, layouts_torch
from kvtune.quality.report import (
    ATTENTION_ERROR_FLAG,
    RANDOM_INIT_NOTE,
    DtypeMeasurement,
    KVQualityReport,
    PromptSetSummary,
)

ATTENTION_NAME = "kvtune_kv_quality"
PROMPT_SET = "calibration-v1"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    text: str


def calibration_prompts(path: Path | None = None) -> list[Prompt]:
    """The prompt set shipped with kvtune (``quality/data/calibration-v1.jsonl``), or a
    JSONL file of ``{"id", "kind", "text"}`` objects."""
    text = (path.read_text() if path is not None else
            resources.files("kvtune.quality").joinpath("data", f"{PROMPT_SET}.jsonl")
            .read_text())
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [Prompt(str(r.get("id", i)), str(r.get("kind", "text")), str(r["text"]))
            for i, r in enumerate(rows)]


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any | None
    name: str
    weights: Literal["checkpoint", "random-init"]
    evidence: checkpoint.CheckpointKVScales
    scales: dict[int, dict[str, Any]]  # layer -> {"k": …, "v": …, "q": …} from the checkpoint
    activation_dtype: str
    device: str


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.match(text)) and not Path(text).exists()


def resolve_source(text: str, revision: str | None = None) -> Path:
    """A local path as it is; a Hugging Face id is downloaded (config, weights, tokenizer)
    the way vLLM does it, so HF_TOKEN / HF_HOME from the runtime's pod template apply."""
    path = Path(text)
    if path.exists() or not looks_like_hub_id(text):
        return path
    from huggingface_hub import snapshot_download

    rev = None if revision in (None, "unpinned") else revision
    return Path(snapshot_download(repo_id=text, revision=rev, allow_patterns=[
        "*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken"]))


def _torch_dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors")) or any(model_dir.glob("*.bin"))


def load_model(source: Path, *, device: str = "auto", seed: int = 0,
               activation_dtype: str | None = None) -> LoadedModel:
    """A model directory (config.json + weights; tokenizer if present) or a bare config.json
    (random initialisation, seeded)."""
    import torch
    import transformers

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config_path = source if source.is_file() else source / "config.json"
    if not config_path.exists():
        raise ValueError(f"--model {source}: no config.json there; pass a model directory "
                         "(config.json + weights) or a config.json")
    model_dir = config_path.parent
    raw = json.loads(config_path.read_text())
    if raw.get("kv_lora_rank") or (raw.get("text_config") or {}).get("kv_lora_rank"):
        raise ValueError("an MLA model (kv_lora_rank in config.json): vLLM caches its latent "
                         "(fp8_ds_mla layouts), which kvtune does not reproduce; not measured")
    evidence = checkpoint.read(model_dir)
    wanted = activation_dtype or str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
    torch_dtype = getattr(torch, wanted) if wanted in ("bfloat16", "float16", "float32") \
        else torch.bfloat16
    tokenizer = None
    if source.is_dir() and _has_weights(model_dir):
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch_dtype, attn_implementation="sdpa")
        weights: Literal["checkpoint", "random-init"] = "checkpoint"
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        except (OSError, ValueError):
            tokenizer = None
        scales = checkpoint_scales(model_dir)
    else:
        config = transformers.AutoConfig.for_model(**raw)
        torch.manual_seed(seed)
        auto: Any = transformers.AutoModelForCausalLM  # untyped in transformers
        # Initialised where it runs: an 8B-shaped model is 16 GB, slow to fill on a CPU.
        with torch.device(device):
            model = auto.from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
        weights = "random-init"
        scales = {}
    model.to(device)
    model.eval()
    name = str(raw.get("_name_or_path") or model_dir.name)
    return LoadedModel(model, tokenizer, name, weights, evidence, scales,
                       _torch_dtype_name(torch_dtype), device)


def checkpoint_scales(model_dir: Path) -> dict[int, dict[str, Any]]:
    """k/v/q scales per layer from the checkpoint's safetensors (only those tensors read)."""
    from safetensors import safe_open

    layer_re = re.compile(r"layers\.(\d+)\.")
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                side = next((s for s in ("k", "v", "q", "kv") if name.endswith(f".{s}_scale")),
                            None)
                m = layer_re.search(name)
                if side is None or m is None:
                    continue
                value = np.asarray(f.get_tensor(name), dtype=np.float32).reshape(-1)
                entry = out.setdefault(int(m.group(1)), {})
                if side == "kv":  # vLLM remaps kv_scale to k_scale and duplicates it
                    entry.setdefault("k", value)
                    entry.setdefault("v", value)
                else:
                    entry[side] = value
    return out


def layer_scales(loaded: LoadedModel, layer: int) -> tuple[Any, Any, Any]:
    """(k_scale, v_scale, q_scale) vLLM uses for per-tensor fp8 in this layer: the
    checkpoint's, else 1.0; a missing q_scale is k_scale when the checkpoint has KV scales
    (``kv_cache.py`` line 147-154), 1.0 otherwise."""
    entry = loaded.scales.get(layer, {})
    if "k" not in entry or "v" not in entry:
        return 1.0, 1.0, float(np.max(entry["q"])) if "q" in entry else 1.0
    k, v = entry["k"], entry["v"]
    k = float(k[0]) if k.size == 1 else k
    v = float(v[0]) if v.size == 1 else v
    q = entry.get("q")
    q_scale = float(np.max(q)) if q is not None else float(np.max(k))
    return k, v, q_scale


def tokenize(loaded: LoadedModel, text: str, max_tokens: int) -> list[int]:
    """The tokenizer's ids; without one (a bare config.json), the text's UTF-8 bytes modulo
    the vocabulary — enough to drive a random model."""
    if loaded.tokenizer is not None:
        ids = list(loaded.tokenizer(text)["input_ids"])
    else:
        vocab = int(loaded.model.config.vocab_size)
        ids = [b % vocab for b in text.encode()]
    return ids[:max_tokens]


@dataclass
class _Hook:
    loaded: LoadedModel
    dtypes: Sequence[str]
    mode: str = "reference"
    active: str | None = None
    sq_err: dict[str, dict[int, float]] = field(default_factory=dict)
    sq_ref: dict[int, float] = field(default_factory=dict)
    roundtrip_seconds: float = 0.0

    def quantize(self, dtype: str, layer: int, query: Any, key: Any, value: Any
                 ) -> tuple[Any, Any, Any]:
        started = time.perf_counter()
        try:
            return self._quantize(dtype, layer, query, key, value)
        finally:
            self.roundtrip_seconds += time.perf_counter() - started

    def _quantize(self, dtype: str, layer: int, query: Any, key: Any, value: Any
                  ) -> tuple[Any, Any, Any]:
        """On the model's device through ``layouts_torch`` (bit-identical to the numpy
        reference ``layouts``; tests/quality/test_quality_layouts_torch.py)."""
        lay = layouts.layout(dtype)
        k_scale, v_scale, q_scale = layer_scales(self.loaded, layer)
        act = self.loaded.activation_dtype

        def side(x: Any, scale: Any) -> Any:
            # [batch, heads, tokens, dim]: the layouts work per (token, head) over dim, so
            # [batch * tokens, heads, dim] is the same computation.
            flat = x.transpose(1, 2).reshape(-1, x.shape[1], x.shape[3])
            out = layouts_torch.roundtrip(dtype, flat, scale, act)
            return out.reshape(x.shape[0], x.shape[2], x.shape[1], x.shape[3]).transpose(1, 2)

        q = query
        if lay.quantizes_query:  # FlashAttention 3 / FlashInfer read Q in fp8 too
            q = layouts_torch.fp8_per_tensor(query, float(np.max(q_scale)))
        return q, side(key, k_scale), side(value, v_scale)

    def attention(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  **kwargs: Any) -> tuple[Any, None]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        layer = int(getattr(module, "layer_idx", 0))
        out_dtype = query.dtype

        def attend(q: Any, k: Any, v: Any) -> Any:
            mask = attention_mask.float() if attention_mask is not None \
                and attention_mask.dtype.is_floating_point else attention_mask
            out, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask,
                                            **kwargs)
            return out

        if self.mode == "reference":
            ref = attend(query, key, value)
            self.sq_ref[layer] = self.sq_ref.get(layer, 0.0) + float((ref ** 2).sum())
            for dtype in self.dtypes:
                got = attend(*self.quantize(dtype, layer, query, key, value))
                errs = self.sq_err.setdefault(dtype, {})
                errs[layer] = errs.get(layer, 0.0) + float(((got - ref) ** 2).sum())
            return ref.to(out_dtype), None
        assert self.active is not None
        return attend(*self.quantize(self.active, layer, query, key, value)).to(out_dtype), None


def _install(hook: _Hook) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, hook.attention)
    hook.loaded.model.set_attn_implementation(ATTENTION_NAME)


def measure(loaded: LoadedModel, dtypes: Sequence[str], *, prompts: Sequence[Prompt],
            max_prompt_tokens: int = 2048, revision: str | None = None,
            progress: Progress = lambda _m: None) -> KVQualityReport:
    import torch

    for dtype in dtypes:
        layouts.layout(dtype)  # a bad name fails before any work
    start = time.monotonic()
    hook = _Hook(loaded, list(dtypes))
    _install(hook)
    kls: dict[str, list[np.ndarray]] = {d: [] for d in dtypes}
    agree: dict[str, list[np.ndarray]] = {d: [] for d in dtypes}
    tokens_total = 0
    phases = {"reference_passes": 0.0, "quantized_passes": 0.0}
    with torch.inference_mode():
        for i, prompt in enumerate(prompts, 1):
            ids = tokenize(loaded, prompt.text, max_prompt_tokens)
            if len(ids) < 2:
                continue
            tokens_total += len(ids)
            progress(f"prompt {i}/{len(prompts)} {prompt.id} ({prompt.kind}, {len(ids)} "
                     f"tokens): 16-bit pass + {len(dtypes)} dtype(s)")
            input_ids = torch.tensor([ids], device=loaded.device)
            hook.mode = "reference"
            t0 = time.perf_counter()
            ref = torch.log_softmax(loaded.model(input_ids).logits[0].float(), dim=-1)
            ref_top = ref.argmax(dim=-1)
            phases["reference_passes"] += time.perf_counter() - t0
            hook.mode = "quantized"
            for dtype in dtypes:
                hook.active = dtype
                t0 = time.perf_counter()
                got = torch.log_softmax(loaded.model(input_ids).logits[0].float(), dim=-1)
                phases["quantized_passes"] += time.perf_counter() - t0
                kl = (ref.exp() * (ref - got)).sum(dim=-1).clamp_min(0.0)
                kls[dtype].append(kl.cpu().numpy())
                agree[dtype].append((got.argmax(dim=-1) == ref_top).cpu().numpy())
    measurements = [_summarise(hook, loaded, d, kls[d], agree[d]) for d in dtypes]
    return KVQualityReport(
        model=loaded.name, revision=revision, weights=loaded.weights,
        note=RANDOM_INIT_NOTE if loaded.weights == "random-init" else "",
        device=loaded.device, activation_dtype=loaded.activation_dtype,
        prompt_set=PromptSetSummary(name=PROMPT_SET, prompts=len(prompts), tokens=tokens_total),
        checkpoint=loaded.evidence, measurements=measurements,
        seconds=round(time.monotonic() - start, 3),
        seconds_by_phase={**{k: round(v, 3) for k, v in phases.items()},
                          "kv_roundtrips": round(hook.roundtrip_seconds, 3)})


def _summarise(hook: _Hook, loaded: LoadedModel, dtype: str, kls: list[np.ndarray],
               agree: list[np.ndarray]) -> DtypeMeasurement:
    lay = layouts.layout(dtype)
    layers = sorted(hook.sq_ref)
    per_layer = [float(np.sqrt(hook.sq_err.get(dtype, {}).get(n, 0.0) / hook.sq_ref[n]))
                 if hook.sq_ref[n] > 0 else 0.0 for n in layers]
    kl = np.concatenate(kls) if kls else np.zeros(1)
    ok = np.concatenate(agree) if agree else np.ones(1, bool)
    worst = int(np.argmax(per_layer)) if per_layer else 0
    if lay.needs_static_scale:
        scales = ("the checkpoint's k_scale/v_scale" if loaded.scales
                  else "k_scale = v_scale = 1.0 (no calibrated scales in the checkpoint)")
    else:
        scales = lay.scales
    return DtypeMeasurement(
        dtype=dtype, bits=lay.bits, scales=scales, kl_mean=float(kl.mean()),
        kl_p95=float(np.quantile(kl, 0.95)), kl_max=float(kl.max()),
        top1_agreement=float(ok.mean()),
        attention_error_max=max(per_layer, default=0.0),
        attention_error_worst_layer=layers[worst] if layers else 0,
        attention_error_per_layer=[round(e, 6) for e in per_layer],
        flagged_layers=[layers[j] for j, e in enumerate(per_layer) if e > ATTENTION_ERROR_FLAG])
