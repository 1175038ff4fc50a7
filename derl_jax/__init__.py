"""derl_jax: Differentiable Evolutionary RL for automatic reward discovery."""
