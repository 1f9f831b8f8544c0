"""The planner: ``planning.plan_pool`` makes the decisions in order, one ``decide_*`` module per
knob, over the facts in ``kvtune.tuner.facts`` (docs/planner.md)."""
