"""Search methods, one module or folder each; every module here registers with
`derl_jax.outer.registry.register_strategy` and is found by package discovery."""
