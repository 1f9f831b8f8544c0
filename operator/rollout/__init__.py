"""A pool's rollout as stages, each a small module with typed inputs and outputs.

``plan`` (spec, model, profile -> ``Planned``) -> ``render`` (GPU nodes, pod template,
rendered objects -> ``Rendered``) -> ``canary`` (start, wait, promote or roll back ->
``CanaryResult``) -> ``apply`` (server-side apply -> the Deployment the server holds) ->
``observe`` (the Deployment's progress -> the pool's final ``PoolOutcome``).

Each stage either hands its output to the next or ends the pool with a ``PoolOutcome``
(a failure names the field, the value and the fix, and leaves the running objects as they
are). ``pool.rollout_pool`` runs them in order; ``operator/reconcile.py`` runs it for every
pool and turns the outcomes into conditions; ``operator/kube/status.py`` writes status.
"""
