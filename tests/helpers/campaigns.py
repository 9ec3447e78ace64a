"""A tiny campaign (2 seeds × 2 runs of 14 steps) shared by the campaign tests."""

TINY = """
name = "tiny"
experiment = "Tiny: a kill at a step boundary"
description = "2 ranks, 14 steps, slot 1 exits after step 5"
published_by = "a made-up paper"
seeds = [1, 2]
[job]
nproc = 2
steps = 14
global_batch = 8
dataset = "synthetic:64"
ckpt_every = 4
[[faults]]
kind = "kill-boundary"
slot = 1
step = 5
[[runs]]
name = "reference"
reference = true
[[runs]]
name = "kill"
published = { goodput_delta_pct = -7.98, restarts = 1 }
"""
