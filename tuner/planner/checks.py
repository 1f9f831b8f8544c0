"""The names of the planner's checks: ``CandidateVerdict.check`` says which check kept or
ruled out a candidate, ``Reason.code`` how a knob was decided. Documented CamelCase
constants, stable for scripts and the operator's status."""

from __future__ import annotations

# Verdicts on one candidate value.
CHOSEN = "Chosen"
FITS = "Fits"
PINNED = "Pinned"
BELOW_QUALITY_FLOOR = "BelowQualityFloor"  # narrower than policy.lowest_kv_precision
# The KV-quality gate (tuner.kv_quality keeps the names): measured KL above the limit, or
# unmeasured while the policy requires a measurement.
EXCEEDS_KV_QUANTIZATION_KL = "ExceedsKVQuantizationKL"
KV_MEASUREMENT_REQUIRED = "MeasurementRequired"
UNSUPPORTED_BY_BACKEND = "UnsupportedByBackend"  # no vLLM backend runs it on this GPU
SWITCHES_BACKEND = "SwitchesToSlowerBackend"  # vLLM would fall back from its preferred one
NOT_MODELED = "NotModeledByKvtune"  # exists in vLLM, page layout unknown to kvtune
WIDER_MEETS_TARGET = "WiderDTypeMeetsTarget"  # a wider dtype already holds the target
TOO_FEW_SEQUENCES = "TooFewSequences"  # holds fewer than the target concurrency
MAX_MODEL_LEN_DOES_NOT_FIT = "MaxModelLenRequestDoesNotFit"  # fails pre-flight
FAILS_SLO = "FailsSLO"  # the scorer says it misses the TTFT or TPOT SLO
LOWER_THROUGHPUT = "LowerThroughput"
MORE_WASTE = "MoreWaste"  # as good, but more fragmentation / sequences

# How the weights are loaded (tuner.weights.weights_load): the flags the weights dtype needs.
WEIGHTS_AS_PLANNED = "WeightsAsPlanned"

# Scored candidates: how the winner was found.
BEST_SCORED_WITHIN_SLO = "BestScoredWithinSLO"
LEAST_SLO_VIOLATION = "LeastSLOViolation"
