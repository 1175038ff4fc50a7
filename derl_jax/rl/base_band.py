"""The base policy's difficulty-setting property, measured when the warm start is built, and its band.

A known-answer domain states a band `Domain.base_policy_band = {primitive name: (low, high)}`:
the mean of each named primitive over completions sampled from the base policy (the inner
loop's sampling settings, one completion per prompt of the first `PROBE_PROMPTS` rows of the
inner-training split, a fixed key) must lie in [low, high]. That is what the first inner step
sees, so it is what sets how hard the task is for a reward. A base policy outside the band is
refused with one line (`BasePolicyOutOfBand`, an `InputError`: exit code 2 from the launcher)
before any reinforcement learning runs.

    measured = measure(domain, graphdef, params, inner_cfg, prompts=train_prompts)
    check_band(measured, domain.base_policy_band, where="config.seed=0")
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from derl_jax.config import InputError
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.rl.rollout import sample_rollouts

PROBE_PROMPTS = 512     # ours: the mean of a rate near 0.3 to about +-0.02 (one std)
PROBE_SEED = 20_251     # ours: any fixed key; the same for every run, so a measurement repeats exactly


class BasePolicyOutOfBand(InputError):
    """The base policy's measured property lies outside the domain's declared band."""


def measure(domain: Domain, graphdef: nnx.GraphDef, params: nnx.State, inner_cfg: Any, dataset: TokenDataset,
            prompts: int = PROBE_PROMPTS) -> dict[str, float]:
    """{primitive name: mean over one sampled completion of each of the first `prompts` rows of
    `dataset`} for every primitive of `domain` (device primitives; f32[N, P] averaged over N).

    Sampling follows `inner_cfg` (temperature, top_k) with the fixed key `PROBE_SEED`."""
    rows = np.arange(min(int(prompts), dataset.size))
    probe = dataset.take(rows)
    rollouts = sample_rollouts(graphdef, params, probe.prompts, probe.prompt_mask, jax.random.key(PROBE_SEED),
                               max_new_tokens=int(domain.max_new_tokens), eos_id=int(domain.eos_id),
                               pad_id=int(domain.pad_id), stop_ids=tuple(domain.stop_ids),
                               temperature=float(inner_cfg.temperature), top_k=int(inner_cfg.top_k), greedy=False)
    values = domain.primitive_values({"tokens": rollouts.completions, "mask": rollouts.mask}, probe.context)
    means = np.asarray(jnp.mean(values, axis=0), np.float64)
    return {name: float(value) for name, value in zip(domain.primitive_names, means)}


def band_violations(measured: Mapping[str, float], band: Mapping[str, tuple[float, float]]) -> list[str]:
    """'name=value outside [low, high]' for each banded primitive whose measured mean is outside its band."""
    wrong = []
    for name, (low, high) in band.items():
        value = measured[name]
        if not float(low) <= value <= float(high):
            wrong.append(f"{name}={value:.3f} outside [{float(low):.3f}, {float(high):.3f}]")
    return wrong


def check_band(measured: Mapping[str, float], band: Mapping[str, tuple[float, float]], *, domain: str,
               where: str) -> None:
    """Raise `BasePolicyOutOfBand` (one line naming `where`, the values and the band) when any banded
    mean of `measured` is outside `band`; an empty band accepts everything."""
    missing = sorted(set(band) - set(measured))
    if missing:
        raise ValueError(f"check_band: the band names primitives {missing} that were not measured")
    wrong = band_violations(measured, band)
    if wrong:
        raise BasePolicyOutOfBand(
            f"{where}: the {domain} base policy's sampled {'; '.join(wrong)} (the domain's base_policy_band); "
            f"the warm start (config.policy.sft_*) no longer gives the task its declared difficulty")
