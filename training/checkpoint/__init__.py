"""Checkpoint strategies for losing every in-memory copy (the whole job died, preemption).

In-memory healing covers single faults; checkpoints are for when no member holds the
state any more. All strategies share one on-disk layout (training.checkpoint.atomic) and one
loader (training.checkpoint.base). Import from the submodules: the writer processes must not import torch.
"""
