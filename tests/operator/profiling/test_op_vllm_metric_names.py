"""kvtune's table of vLLM metrics (operator/prometheus/vllm_metrics.py) against the pinned wheel's
own
``vllm/v1/metrics/loggers.py`` and ``buckets.py``, read with ast (vLLM is never imported)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from kvtune.operator.prometheus import vllm_metrics as vm

pytestmark = pytest.mark.vllm_source


def _vllm_root() -> Path:
    cache = Path(os.environ.get("KVTUNE_CACHE", Path.home() / ".cache" / "kvtune"))
    root = cache / f"vllm-src-{vm.VLLM_VERSION}" / "vllm"
    if not (root / "v1" / "metrics" / "loggers.py").is_file():
        pytest.fail(f"{root} missing: run `python scripts/fetch_vllm_source.py` (or setup.sh)")
    return root


def _kw(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _declared_metrics() -> dict[str, tuple[str, str | None, ast.expr | None]]:
    """name -> (kind, buckets variable name, labelnames expr) for every
    ``self._gauge_cls/_counter_cls/_histogram_cls(name="vllm:...")`` call."""
    tree = ast.parse((_vllm_root() / "v1" / "metrics" / "loggers.py").read_text())
    kinds = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
    out: dict[str, tuple[str, str | None, ast.expr | None]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in kinds):
            continue
        name = _kw(node, "name")
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        buckets = _kw(node, "buckets")
        out[name.value] = (
            kinds[node.func.attr],
            buckets.id if isinstance(buckets, ast.Name) else None,
            _kw(node, "labelnames"),
        )
    return out


def _bucket_variables() -> dict[str, str]:
    """loggers.py's ``x_buckets = histogram_buckets("family", ...)`` assignments."""
    tree = ast.parse((_vllm_root() / "v1" / "metrics" / "loggers.py").read_text())
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "histogram_buckets"
                and isinstance(node.targets[0], ast.Name)):
            family = node.value.args[0]
            assert isinstance(family, ast.Constant)
            out[node.targets[0].id] = str(family.value)
    return out


def _bucket_constants() -> dict[str, tuple[float, ...]]:
    tree = ast.parse((_vllm_root() / "v1" / "metrics" / "buckets.py").read_text())
    consts: dict[str, tuple[float, ...]] = {}
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(node.value, ast.Tuple)):
            consts[node.target.id] = tuple(ast.literal_eval(node.value))
    families: dict[str, tuple[float, ...]] = {}
    for node in tree.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "_STATIC_FAMILY_DEFAULTS"):
            assert isinstance(node.value, ast.Dict)
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(k, ast.Constant) and isinstance(v, ast.Name)
                families[str(k.value)] = consts[v.id]
    return families


def test_every_metric_kvtune_uses_exists_in_vllm_with_the_same_kind() -> None:
    declared = _declared_metrics()
    assert len(declared) > 30, "the parser found too few metrics; loggers.py changed shape?"
    for spec in vm.METRICS:
        assert spec.name in declared, f"{spec.name} is not a metric of vLLM {vm.VLLM_VERSION}"
        assert declared[spec.name][0] == spec.kind, (spec.name, declared[spec.name][0])
    assert vm.CACHE_CONFIG_INFO == "vllm:cache_config_info"
    assert '"vllm:cache_config_info"' in (_vllm_root() / "v1/metrics/loggers.py").read_text()


def test_histogram_bucket_families_and_bounds_match() -> None:
    declared, variables, families = _declared_metrics(), _bucket_variables(), _bucket_constants()
    for spec in vm.METRICS:
        if spec.kind != "histogram":
            continue
        var = declared[spec.name][1]
        assert var is not None, spec.name
        assert variables[var] == spec.bucket_family, (spec.name, variables[var])
        if spec.bucket_family != "request_tokens":
            assert vm.buckets_for(spec.bucket_family, 1) == families[spec.bucket_family], spec.name


def test_token_buckets_are_1_2_5_up_to_max_model_len() -> None:
    # The function itself in vLLM: build_buckets([1, 2, 5], max_value).
    src = (_vllm_root() / "v1" / "metrics" / "buckets.py").read_text()
    assert "return build_buckets([1, 2, 5], max_value)" in src
    assert "return build_1_2_5_buckets(max_model_len)" in src
    assert vm.build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert vm.build_1_2_5_buckets(131072)[-1] == 100_000


def test_labels_are_model_name_engine_plus_extras() -> None:
    declared = _declared_metrics()
    for spec in vm.METRICS:
        labels = declared[spec.name][2]
        text = ast.unparse(labels) if labels is not None else ""
        if spec.extra_labels:
            for extra in spec.extra_labels:
                assert repr(extra).replace("'", '"') in text or extra in text, (spec.name, text)
        else:
            assert text == "labelnames", (spec.name, text)
    src = (_vllm_root() / "v1" / "metrics" / "loggers.py").read_text()
    assert 'labelnames = ["model_name", "engine"]' in src


def test_finished_reasons_and_cache_config_labels_exist() -> None:
    engine_src = (_vllm_root() / "v1" / "engine" / "__init__.py").read_text()
    assert f"FINISH_REASON_STRINGS = {vm.FINISHED_REASONS!r}".replace("'", '"') in engine_src
    cache_src = (_vllm_root() / "config" / "cache.py").read_text()
    for label in vm.CACHE_CONFIG_INFO_LABELS:
        if label == "engine":
            continue  # added by log_metrics_info
        assert f"\n    {label}: " in cache_src, f"CacheConfig has no field {label}"


def test_source_label_values_are_vllms() -> None:
    """``vllm:prompt_tokens_by_source``'s sources are PromptTokenStats.ALL_SOURCES and
    ``vllm:prompt_tokens_cached_by_source``'s are CacheHitSource's values."""
    stats = (_vllm_root() / "v1" / "metrics" / "stats.py").read_text()
    sources = ", ".join(f'"{s}"' for s in vm.PROMPT_TOKEN_SOURCES)
    assert " ".join(stats.split()).count(f"ALL_SOURCES: tuple[str, ...] = ( {sources}, )") == 1
    tree = ast.parse((_vllm_root() / "v1" / "metrics" / "cache_hit_source.py").read_text())
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CacheHitSource")
    values = tuple(ast.literal_eval(n.value) for n in enum.body
                   if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant))
    assert values == vm.CACHE_HIT_SOURCES
    assert vm.SOURCE_LABELS == {vm.PROMPT_TOKENS_BY_SOURCE: vm.PROMPT_TOKEN_SOURCES,
                                vm.PROMPT_TOKENS_CACHED_BY_SOURCE: vm.CACHE_HIT_SOURCES}
