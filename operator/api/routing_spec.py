"""The spec's routing: the Gateway API Inference Extension objects and the HTTPRoute.

Part of ``kvtune.operator.api`` (which re-exports every name here).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from kvtune.operator.api.schema_base import _DNS_LABEL, _Model

HEADER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class GatewayRef(_Model):
    """The Gateway API Gateway the InferenceDeployment's HTTPRoute attaches to."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    namespace: str | None = Field(default=None, max_length=63, pattern=_DNS_LABEL, description=(
        "The Gateway's namespace; empty: the InferenceDeployment's (a Gateway elsewhere must "
        "allow routes from this namespace in its listener's allowedRoutes)."))
    section_name: str | None = Field(default=None, max_length=253, pattern=_DNS_LABEL,
                                     description="One listener of the Gateway, by name.")


class RoutingSpec(_Model):
    enabled: bool = Field(
        default=False,
        description="Render each pool's Gateway API Inference Extension objects: an "
                    "InferencePool (inference.networking.k8s.io/v1), its endpoint picker's "
                    "configuration, whose prefix-cache scorer hashes in the plan's block size, "
                    "and the endpoint picker's Deployment and Service. Needs the operator's "
                    "routing.enabled chart value (the cluster has the Inference Extension's "
                    "CRDs).",
    )
    gateway: GatewayRef | None = Field(default=None, description=(
        "Also render an HTTPRoute (gateway.networking.k8s.io/v1) named like the "
        "InferenceDeployment, attached to this Gateway, whose backends are the pools' "
        "InferencePools, weighted by replicas."))
    session_header: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=HEADER_NAME_PATTERN, description=(
            "Multi-turn traffic: the request header that names a session (e.g. "
            "x-session-id). The HTTPRoute's rules then carry sessionPersistence of type Header "
            "with this name (Gateway API's experimental channel; Extended support), so a "
            "gateway that implements it keeps a session on one pool. Within a pool, the "
            "endpoint picker keeps multi-turn traffic on the pods holding its prefix."))
    length_header: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=HEADER_NAME_PATTERN, description=(
            "A request header that states the prompt's length in tokens, set by the client "
            "or a gateway transform (nothing in Gateway API or the Inference Extension v1.5.0 "
            "counts a prompt's tokens). The HTTPRoute then sends a request longer than a "
            "pool's max-model-len to the shortest pools that hold it (a RegularExpression "
            "header match); requests without it go to every pool."))

    @model_validator(mode="after")
    def _route_needs_a_gateway(self) -> RoutingSpec:
        if self.gateway is not None and not self.enabled:
            raise ValueError("spec.routing.gateway is set but spec.routing.enabled=false: the "
                             "HTTPRoute's backends are the InferencePools routing renders; "
                             "set enabled: true or remove gateway")
        for field, value in (("sessionHeader", self.session_header),
                             ("lengthHeader", self.length_header)):
            if value is not None and self.gateway is None:
                raise ValueError(f"spec.routing.{field}={value!r} acts in the HTTPRoute, "
                                 f"which needs spec.routing.gateway: name the Gateway, or "
                                 f"remove {field}")
        return self
