"""What a tenant's spec may reach through the operator's token (issue 25 item 3).

The operator renders ``spec.runtime.podTemplate`` and applies it with its own rights; a
tenant allowed only InferenceDeployments and ConfigMaps must not get through it what she
could not get directly. Two rules, on top of the pod policy (``operator/render/pod_policy.py``):

- **Images.** Every container of the rendered pod runs an allowed image: the chart's
  ``podPolicy.allowedImages`` (``--allowed-image``: an exact reference or a glob such as
  ``registry.example.com/vllm/*``) and kvtune's own runtime images; without an allow-list
  also the spec's own ``spec.runtime.image`` (what kvtune renders itself). With one, the
  spec's image must match it too: that closes the last door, a tenant's own image.
- **Secrets.** A Secret reference (volume, projected source, env ``secretKeyRef``,
  ``envFrom.secretRef``, ``imagePullSecrets``) is kept only when the spec names it in
  ``spec.runtime.secrets`` and whoever wrote that spec may read it. The operator cannot ask
  the API server about the writer later: managedFields record field managers, not users,
  and any writer may forge an annotation. So the check is made at admission, where the
  writer is known: the chart's ``tenant-secrets`` ValidatingAdmissionPolicy asks the
  authorizer (a SubjectAccessReview for the requesting user) whether she may ``get`` each
  named Secret, on every create and every spec change. The operator trusts
  ``spec.runtime.secrets`` only when the chart says that policy is installed
  (``--tenant-secrets-admission``); without it every Secret reference is refused (fail
  closed). The chart's ``podPolicy.allowedSecrets`` still bounds it: the operator's token
  may mount no other Secret whoever asks (the operator-pods policy). The admission check
  covers the spec's writer, not the template ConfigMap's: with Secrets named, the spec pins
  the template by its SHA-256 (``spec.runtime.podTemplate.sha256``, ``unpinned_template``).

``check`` is pure; a refusal is one line naming the field, the value and the fix.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtune.operator.calibration import calibration_job as calibration
from kvtune.operator.render import pod_policy

if TYPE_CHECKING:
    from kvtune.operator.api import RuntimeSpec

# kvtune's own images (the runtime images of runtime_images/build.sh, whatever GPU class
# and tag, and the project's other images): its registry namespace.
KVTUNE_RUNTIME_IMAGES = ("ghcr.io/kvtune/*",)


@dataclass
class ReachConfig:
    """Set by ``kvtune operator`` from the chart's values."""

    # podPolicy.allowedImages (--allowed-image): exact references or globs.
    images: tuple[str, ...] = ()
    # admissionPolicy.enabled (--tenant-secrets-admission): the API server checks, on every
    # spec write, that the writer may read each Secret in spec.runtime.secrets.
    secrets_checked_at_admission: bool = False


CONFIG = ReachConfig()


class ReachRefused(ValueError):
    """The spec reaches for something its writer may not; the message names field and fix."""


def allowed_images(spec_image: str) -> tuple[str, ...]:
    """The patterns a container image must match for a spec whose runtime image is
    ``spec_image``."""
    own = list(KVTUNE_RUNTIME_IMAGES)
    template = os.environ.get(calibration.DEFAULT_IMAGE_ENV, "").strip()
    if template:  # the chart's calibration.image: kvtune's runtime image, maybe mirrored
        own.append(template.replace(calibration.GPU_CLASS_PLACEHOLDER, "*"))
    if CONFIG.images:
        return (*CONFIG.images, *own)
    return (spec_image, *own)


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    # fnmatchcase: registry paths are case-sensitive; '*' also spans '/', as a prefix should.
    return any(image == p or fnmatch.fnmatchcase(image, p) for p in patterns)


def _image_refusals(spec: Mapping[str, Any], spec_image: str) -> list[str]:
    patterns = allowed_images(spec_image)
    found = []
    for path, container in pod_policy.iter_containers(spec):
        image = container.get("image")
        if isinstance(image, str) and image_allowed(image, patterns):
            continue
        fix = ("ask the platform team to add it to the chart's podPolicy.allowedImages"
               if CONFIG.images else "use spec.runtime.image or one of kvtune's runtime "
               "images, or ask the platform team to add it to the chart's "
               "podPolicy.allowedImages")
        found.append(f"{path}.image={image!r} is not an allowed image (allowed: "
                     f"{', '.join(patterns)}): the operator would run it with its own rights. "
                     f"Fix: {fix}")
    return found


def _secret_refusals(spec: Mapping[str, Any], named: Sequence[str]) -> list[str]:
    found = []
    for where, name in pod_policy.secret_names(spec):
        if name not in named:
            found.append(f"{where}={name!r}: a Secret the spec does not name. Fix: add it to "
                         f"spec.runtime.secrets (the API server then checks that you may "
                         f"read it), or remove the reference")
        elif not CONFIG.secrets_checked_at_admission:
            found.append(f"{where}={name!r}: nothing checked that this spec's writer may read "
                         f"the Secret (this operator runs without the chart's tenant-secrets "
                         f"admission policy). Fix: install the chart with "
                         f"admissionPolicy.enabled=true, or remove the reference")
    return found


def check(pod: Mapping[str, Any], *, spec_image: str, spec_secrets: Sequence[str]) -> None:
    """Raise ``ReachRefused`` (the first refusal, and how many more) when the rendered pod
    ``pod`` (metadata, spec) runs an image or reads a Secret its spec may not reach."""
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    found = [*_image_refusals(spec, spec_image), *_secret_refusals(spec, spec_secrets)]
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ReachRefused(found[0] + more)


def unpinned_template(runtime: RuntimeSpec, template: str | None) -> str | None:
    """Why ``template`` (the text of spec.runtime.podTemplate's ConfigMap key) may not be
    rendered beside the spec's Secrets; None when it may. The admission check covers the
    spec's writer, not the ConfigMap's: with a Secret named, the spec pins the template by
    its digest, so a ConfigMap writer cannot change what runs with the Secret."""
    if not runtime.secrets or template is None or runtime.pod_template is None:
        return None
    digest = hashlib.sha256(template.encode()).hexdigest()
    pinned = runtime.pod_template.sha256
    if pinned == digest:
        return None
    got = f"={pinned!r}" if pinned else " is unset"
    return (f"spec.runtime.podTemplate.sha256{got}, but the template in ConfigMap "
            f"{runtime.pod_template.config_map_ref.name} (key "
            f"{runtime.pod_template.config_map_ref.key}) has SHA-256 {digest}: with "
            f"spec.runtime.secrets set the spec pins the template it runs beside them. Fix: "
            f"review the template, then set spec.runtime.podTemplate.sha256 to its digest")

