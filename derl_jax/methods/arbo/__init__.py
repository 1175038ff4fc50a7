"""History-driven reward search (ARBO) and greedy refinement (Eureka-style): the history and its
queries (`history`), the explore/exploit schedule (`schedule`), the structural proposer
(`proposer`), the tool-using LLM agent (`agent`, `tools`), the `arbo` config block
(`settings`), and the strategies (`strategy`, `eureka`)."""
