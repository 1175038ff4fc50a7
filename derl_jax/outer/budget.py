"""Inner-step budgets of the methods: DERL-pop's schedule and the totals reported.

The paper keeps DERL-pop's total inner training equal to the final policies': the evolved policy
is trained `iterations x inner steps` along its lineage (ALFWorld 10 x 10, ScienceWorld 3 x 33,
math 7 x 2 epochs), the steps of the policy DERL reports (100 steps; 15 epochs for math), while
DERL trains every candidate for its full inner run. Here the schedule follows from the final
budget: `config.outer.population_iterations` (0: `outer.iterations`) sets DERL-pop's iterations,
and `config.outer.population_inner_steps` its inner steps per candidate, where 0 (the default)
means `max(1, final.steps // population iterations)`, so its evolved policy trains as many steps
as the final policy of a search method (3 x 33 = 99 of 100: the division rounds down).

`final_steps(cfg, searches)`: the final policy of a search method trains `final.steps`; that of
a fixed-expression baseline `final.baseline_steps` when set (the paper gives its agent baselines
150 steps to DERL's 100; Appendix B: DERL gets no more final steps than a baseline).
"""

from __future__ import annotations

from typing import Any, Mapping

from derl_jax.config import config_value, has_field


def _configured(cfg: Any, path: str) -> int:
    return int(config_value(cfg, path)) if has_field(cfg, path) else 0


def population_iterations(cfg: Any) -> int:
    """Outer iterations of a population strategy (module docstring)."""
    return _configured(cfg, "outer.population_iterations") or int(config_value(cfg, "outer.iterations"))


def population_inner_steps(cfg: Any) -> int:
    """Inner steps per candidate of a population strategy (module docstring)."""
    configured = _configured(cfg, "outer.population_inner_steps")
    if configured > 0:
        return configured
    return max(1, int(config_value(cfg, "final.steps")) // population_iterations(cfg))


def final_steps(cfg: Any, searches: bool) -> int:
    """Inner steps of a method's final policy: `final.steps` for a search method, else
    `final.baseline_steps` (0 or absent: `final.steps`)."""
    steps = int(config_value(cfg, "final.steps"))
    return steps if searches else (_configured(cfg, "final.baseline_steps") or steps)


def candidate_inner_steps(cfg: Any, population: bool) -> int:
    """Inner steps each search candidate trains: DERL-pop's own setting, else `inner.steps`."""
    return population_inner_steps(cfg) if population else int(config_value(cfg, "inner.steps"))


def inner_step_totals(cfg: Any, budget: Mapping[str, int], *, population: bool) -> dict[str, int]:
    """The inner steps a search method spent and the steps behind its reported policy.

    inner_steps_per_candidate: what each candidate trained.
    search_inner_steps: candidate trainings run x inner_steps_per_candidate.
    reported_policy_inner_steps: the headline policy's training — the evolved policy's lineage
        (iterations that advanced it x inner_steps_per_candidate) for population strategies,
        `final.steps` for the others.
    retrained_policy_inner_steps: `final.steps`, the policy retrained with the chosen expression.
    """
    per_candidate = candidate_inner_steps(cfg, population)
    retrained = final_steps(cfg, searches=True)
    lineage = int(budget.get("start_policy_updates", 0)) * per_candidate
    return {
        "inner_steps_per_candidate": per_candidate,
        "search_inner_steps": int(budget.get("candidates_trained", 0)) * per_candidate,
        "reported_policy_inner_steps": lineage if population else retrained,
        "retrained_policy_inner_steps": retrained,
    }
