"""A household environment in JAX (ALFWorld's six task kinds), its tasks, levels and expert.

vocab.py    the fixed word vocabulary and the object / receptacle catalogue
tasks.py    `Task` arrays, the task generator, seen/unseen types, levels L0 / L1 / L2
actions.py  the action templates: parse a policy's tokens, write an action
env.py      `HouseholdEnv`: pure reset / step, goals, meta-tag step scores
expert.py   the scripted expert, random perturbations, vmapped episode rollouts
prompt.py   a turn's prompt from the task, the last W turns and the current observation
corpus.py   the supervised warm-start corpus of (prompt, action) turns
domain.py   the `household` domain (registered on import of this package)
"""

from derl_jax.domains.household import domain  # noqa: F401  (registers "household")
