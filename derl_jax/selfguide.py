"""Self-Guide's trust schedule lambda(u) and its composite reward as a reward expression.

Self-Guide (co-evolution of a policy and its internal reward) trains on

    R(tau; u) = R_env(tau) + lambda(u) * sum_t r_sg_t

where r_sg_t is the internal reward of the policy's own self-assessment at turn t (the
primitive `g_sg`, primitives/selfguide.py) and u in [0, 1] is the fraction of inner training
done. lambda is the trapezoid trust schedule, with phase boundaries (fractions of training)
0 <= warmup <= ramp_end <= anneal_start <= 1:

    phase I    u <  warmup                  lambda = 0   (warm-up: assessments steer actions only)
    phase II   warmup <= u < ramp_end       lambda rises linearly from 0 to 1
    phase III  ramp_end <= u <= anneal_start lambda = 1  (full trust)
    phase IV   u > anneal_start             lambda falls linearly to 0 at u = 1

`warmup == ramp_end == 0` has no warm-up (lambda = 1 from the start); `anneal_start == 1`
has no annealing. A ramp of zero length after a warm-up (0 < warmup == ramp_end) is refused.

The schedule is written as a reward expression (`trust_text`, `composite_text`) with the
language's clip/min and `u`, so the fixed Self-Guide reward trains through the same inner
loop as any candidate; `trust` is the same function on arrays.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

SELF_REWARD_PRIMITIVE = "g_sg"


def check_schedule(warmup: float, ramp_end: float, anneal_start: float, where: str = "trust schedule") -> None:
    """ValueError naming what is wrong unless 0 <= warmup <= ramp_end <= anneal_start <= 1 with a
    ramp of positive length after a warm-up."""
    values = {"warmup": warmup, "ramp_end": ramp_end, "anneal_start": anneal_start}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{where}: {name} must be a number in [0, 1], got {value!r}")
    if not float(warmup) <= float(ramp_end) <= float(anneal_start):
        raise ValueError(f"{where}: needs warmup <= ramp_end <= anneal_start, got {warmup}, {ramp_end}, {anneal_start}")
    if float(warmup) > 0.0 and float(ramp_end) == float(warmup):
        raise ValueError(f"{where}: ramp_end must be above warmup={warmup} (a ramp of zero length); "
                         f"warmup = ramp_end = 0 means no warm-up")


@dataclasses.dataclass(frozen=True)
class TrustSchedule:
    """Phase boundaries of the trapezoid (fractions of inner training; module docstring)."""

    warmup: float = 0.2
    ramp_end: float = 0.4
    anneal_start: float = 0.8

    def __post_init__(self):
        check_schedule(self.warmup, self.ramp_end, self.anneal_start)


DEFAULT_SCHEDULE = TrustSchedule()


def trust(u, warmup: float, ramp_end: float, anneal_start: float, xp: Any = np):
    """lambda(u) of the trapezoid schedule, elementwise on u (any shape, values in [0, 1]).

    `xp` is the array module (numpy, or jax.numpy inside jitted code)."""
    check_schedule(warmup, ramp_end, anneal_start)
    u = xp.asarray(u) * 1.0   # floating point (float64 under numpy, float32 under jax by default)
    ramp = xp.ones_like(u) if ramp_end == warmup else (u - warmup) / (ramp_end - warmup)
    anneal = xp.ones_like(u) if anneal_start == 1.0 else (1.0 - u) / (1.0 - anneal_start)
    return xp.clip(xp.minimum(ramp, anneal), 0.0, 1.0)


def _number(value: float) -> str:
    """Shortest decimal text of `value` to 10 significant digits (1 - 0.8 -> '0.2')."""
    return format(float(value), ".10g")


def trust_text(warmup: float, ramp_end: float, anneal_start: float) -> str:
    """lambda(u) as a reward expression over `u` (clip, min, + - /); '1' when it is constant."""
    check_schedule(warmup, ramp_end, anneal_start)
    pieces = []
    if ramp_end != warmup:
        shifted = "u" if warmup == 0 else f"(u-{_number(warmup)})"
        pieces.append(f"{shifted}/{_number(ramp_end - warmup)}")
    if anneal_start != 1.0:
        pieces.append(f"(1-u)/{_number(1.0 - anneal_start)}")
    if not pieces:
        return "1"
    inner = pieces[0] if len(pieces) == 1 else f"min({pieces[0]},{pieces[1]})"
    return f"clip({inner},0,1)"


def composite_text(primitive_names: Sequence[str], schedule: TrustSchedule = DEFAULT_SCHEDULE,
                   outcome_index: int = 0) -> str:
    """Self-Guide's reward `g<o> + lambda(u)*g<s>` (o: the outcome primitive, s: `g_sg`) for a
    domain with `primitive_names`; ValueError when the domain has no `g_sg`."""
    names = list(primitive_names)
    if SELF_REWARD_PRIMITIVE not in names:
        raise ValueError(f"the Self-Guide reward needs the primitive {SELF_REWARD_PRIMITIVE!r}, which the domain's "
                         f"primitives {tuple(names)} lack (household, scienceworld, alfworld: set "
                         "config.domain.self_guide=True)")
    if not 0 <= outcome_index < len(names):
        raise ValueError(f"outcome_index {outcome_index} is not one of the {len(names)} primitives")
    lam = trust_text(schedule.warmup, schedule.ramp_end, schedule.anneal_start)
    outcome, self_reward = f"g{outcome_index + 1}", f"g{names.index(SELF_REWARD_PRIMITIVE) + 1}"
    return f"{outcome}+{self_reward}" if lam == "1" else f"{outcome}+{lam}*{self_reward}"


def schedule_from_config(cfg: Any) -> TrustSchedule:
    """The TrustSchedule of the config block `trust` (fields warmup, ramp_end, anneal_start;
    absent ones take the defaults); ValueError naming the field that is wrong."""
    block = cfg.get("trust", None) if hasattr(cfg, "get") else getattr(cfg, "trust", None)
    block = {} if block is None else dict(block)
    unknown = sorted(set(block) - {f.name for f in dataclasses.fields(TrustSchedule)})
    if unknown:
        raise ValueError(f"config.trust: unknown fields {unknown}; expected warmup, ramp_end, anneal_start")
    values = {f.name: block.get(f.name, getattr(DEFAULT_SCHEDULE, f.name)) for f in dataclasses.fields(TrustSchedule)}
    check_schedule(**values, where="config.trust")
    return TrustSchedule(**{name: float(value) for name, value in values.items()})
