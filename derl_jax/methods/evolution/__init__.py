"""Evolutionary search over expression trees: operators, the population, the strategy."""
