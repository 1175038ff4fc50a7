"""DERL and DERL-pop: the Meta-Optimizer (model, grammar constraint, cold-start corpus) and its strategies."""
