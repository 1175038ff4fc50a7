"""ALFWorld through the batched host-environment interface (optional: `pip install 'derl_jax[alfworld]'`).

`engine` plays TextWorld PDDL games with ALFWorld's names (in this process or in worker
processes), `problems` generates ALFRED-domain problems for the six task kinds, `splits` the
levels' games (a user's ALFWorld data directory or generated), `rules` ALFWorld's wording,
command templates and subgoals for the meta-tag rules, `env.AlfWorldEnv` the batched adapter,
`domain` the registered `alfworld` domain (registered on import of this package). Importing
this package does not need the alfworld package; building the domain does, and says what to
install when it is missing.
"""

from derl_jax.domains.alfworld import domain  # noqa: F401  (registers "alfworld")
from derl_jax.domains.alfworld.env import AlfWorldEnv, EngineMissing, require_engine
from derl_jax.domains.alfworld.problems import KINDS, GameSpec, generate_games
from derl_jax.domains.alfworld.splits import level_games

__all__ = ["AlfWorldEnv", "EngineMissing", "GameSpec", "KINDS", "generate_games", "level_games", "require_engine"]
