"""ScienceWorld through the batched host-environment interface (optional: `pip install 'derl_jax[agents]'`
and Java 11+). `engine.Worker` is one simulator (one JVM), `env.ScienceWorldEnv` the batched
adapter, `tags` the meta-tag step scores, `vocab` the word-level vocabulary, `splits` the
benchmark's task-variation splits, `corpus` the warm-start corpus, `domain` the registered
`scienceworld` domain (registered on import of this package). Importing this package needs neither Java nor the package;
starting a worker does, and says what to install when either is missing."""

from derl_jax.domains.scienceworld import domain  # noqa: F401  (registers "scienceworld")
from derl_jax.domains.scienceworld.engine import EngineMissing, Worker, require_engine
from derl_jax.domains.scienceworld.env import ScienceWorldEnv
from derl_jax.domains.scienceworld.splits import level_split, task_arrays
from derl_jax.domains.scienceworld.vocab import Vocabulary, build_vocabulary

__all__ = ["EngineMissing", "ScienceWorldEnv", "Vocabulary", "Worker", "build_vocabulary", "level_split",
           "require_engine", "task_arrays"]
