"""A KV-cache simulator that mirrors vLLM 0.33's block pool and scheduler and scores
configurations on real traffic (docs/simulator.md).

Entry points: ``scheduler.simulate(requests, EngineConfig, StepCostModel)`` (plain numbers),
``engine.simulated_plan(PlanRequest, KVPlan, name)`` (from kvtune's catalog), and
``scoring.SimulatorScorer`` (the planner's ``CandidateScorer``).
"""
