"""Campaigns: one experiment as runs × seeds, resumable, summarized beside published figures.

`campaign` reads a campaign file (TOML); `runner` runs every run × seed in its own directory; `summary`
and `stats` put each metric over seeds (mean, standard deviation, 95% confidence interval); `cli` is `chaos campaign`.
"""
