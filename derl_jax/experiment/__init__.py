"""Experiments: everything a run does beyond parsing flags — the protocol (split, search, final,
compare), generalisation levels, compare worker processes, results, statistics, reports, plots."""
