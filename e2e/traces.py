"""The public request traces that ship with kvtune in ``examples/traces`` (licenses, attribution
and checksums in ``examples/traces/SOURCES.md``). The demo, the tests and ``bench/`` take the
paths from here, so a clone needs nothing beside it."""

from __future__ import annotations

from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parents[1] / "examples" / "traces"
# Azure 2023 conversation trace (CC BY 4.0): lengths only, no prefix information.
AZURE_TRACE = TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"
# Mooncake's FAST'25 synthetic trace (Apache-2.0): long prompts with 512-token prefix hashes.
MOONCAKE_TRACE = TRACES_DIR / "synthetic_trace.jsonl"
