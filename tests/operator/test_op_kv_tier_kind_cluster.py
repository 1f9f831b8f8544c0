"""``spec.tuning.kvTiers`` against the real API server (issue 27): the CRD's CEL rules refuse
a store lmcache 0.5.6 cannot be named by, and a size without a store, with the field and the
fix in the error; a valid allowance is stored as written and reconciled, and a pool planned
by the rules (no arrival rate) says the tiers were not weighed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from bad_specs import BASE, CASES
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from op_cluster_helpers import GROUP, PLURAL, VERSION, get_infd, prepare_namespaces

from kvtune.operator import reconcile as rec
from kvtune.operator.kube.apply import Kube

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NS = "kv-tier-kind"
TIERS = {"diskGiB": 256, "remoteUrl": "lm://lmcache.kv.svc:65432", "remoteGiB": 512}


@pytest.fixture(scope="module")
def cluster_api(local_cluster: Any) -> Any:
    return prepare_namespaces(local_cluster, NS)


def _body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def test_cel_refuses_a_misnamed_store_and_a_valid_allowance_is_reconciled(
        cluster_api: Any) -> None:
    custom = client.CustomObjectsApi(cluster_api)
    cases = [c for c in CASES if c.id.startswith("kv-tier-")]
    assert len(cases) >= 4
    for i, case in enumerate(cases):
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                                   _body(f"bad-{i}", case.spec()),
                                                   field_validation="Strict")
        assert refused.value.status == 422, (case.id, refused.value.body)
        text = json.loads(refused.value.body)["message"]
        for needle in case.needles:
            assert needle in text, (case.id, needle, text)

    spec = copy.deepcopy(BASE)
    spec["tuning"] = {"mode": "auto", "cpuOffloadGiB": 32, "kvTiers": TIERS}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _body("good", spec),
                                           field_validation="Strict")
    stored = get_infd(cluster_api, NS, "good")
    assert stored["spec"]["tuning"]["kvTiers"] == TIERS
    outcome = rec.reconcile(stored, kube=Kube(cluster_api))
    assert outcome.permanent_error is None
    pool = outcome.status["pools"][0]
    assert pool["phase"] == "Applied", pool
    assert any(w.startswith("spec.tuning.kvTiers:") and "requestRatePerSecond" in w
               for w in pool["warnings"]), pool["warnings"]
    assert "kvTier" not in pool  # no LMCache tier chosen without a search
