"""History-driven reward search: ARBO's tool-using LLM agent (`arbo`), the scripted search it is
compared with (`history_search`) and Eureka's loop (`eureka`). The history and its queries
(`history`), the explore/exploit schedule (`schedule`), the structural proposer (`proposer`), the
agent and its workspace (`agent`, `tools`, `sources`), the `arbo` config block (`settings`), and
the strategies (`strategy`, `eureka`)."""
