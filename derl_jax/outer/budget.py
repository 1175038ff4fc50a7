"""Inner-step budgets of the methods: DERL-pop's shorter inner runs and the totals reported.

The paper keeps DERL-pop's total inner training equal to DERL's: the evolved policy is trained
`iterations x population_inner_steps` steps along its lineage (ALFWorld 10 x 10, ScienceWorld
3 x 33, math 7 x 2 epochs), matching the steps of the policy DERL reports (100 steps; 15 epochs
for math), while DERL trains every candidate for its full inner run. Here
`config.outer.population_inner_steps` sets DERL-pop's inner steps per candidate; 0 (the
default) means `max(1, final.steps // outer.iterations)`, so its evolved policy trains as many
steps as the final policy of every other method.
"""

from __future__ import annotations

from typing import Any, Mapping

from derl_jax.config import config_value, has_field


def population_inner_steps(cfg: Any) -> int:
    """Inner steps per candidate of a population strategy (module docstring)."""
    configured = int(config_value(cfg, "outer.population_inner_steps")) if has_field(cfg, "outer.population_inner_steps") else 0
    if configured > 0:
        return configured
    return max(1, int(config_value(cfg, "final.steps")) // int(config_value(cfg, "outer.iterations")))


def candidate_inner_steps(cfg: Any, population: bool) -> int:
    """Inner steps each search candidate trains: DERL-pop's own setting, else `inner.steps`."""
    return population_inner_steps(cfg) if population else int(config_value(cfg, "inner.steps"))


def inner_step_totals(cfg: Any, budget: Mapping[str, int], *, population: bool) -> dict[str, int]:
    """The inner steps a method spent and the steps behind its reported policy.

    inner_steps_per_candidate: what each candidate trained.
    search_inner_steps: candidate trainings run x inner_steps_per_candidate.
    reported_policy_inner_steps: the headline policy's training — the evolved policy's lineage
        (iterations that advanced it x inner_steps_per_candidate) for population strategies,
        `final.steps` for the others.
    retrained_policy_inner_steps: `final.steps`, the policy retrained with the chosen expression.
    """
    per_candidate = candidate_inner_steps(cfg, population)
    final_steps = int(config_value(cfg, "final.steps"))
    lineage = int(budget.get("start_policy_updates", 0)) * per_candidate
    return {
        "inner_steps_per_candidate": per_candidate,
        "search_inner_steps": int(budget.get("candidates_trained", 0)) * per_candidate,
        "reported_policy_inner_steps": lineage if population else final_steps,
        "retrained_policy_inner_steps": final_steps,
    }
