"""What runs inside a training process: the @Wrapper decorator and what the training function sees.

`decorator.Wrapper` runs the function and restarts it in-process when its generation fails;
`call.CallWrapper` is the function's view of its generation (rank, process group, `check()`, `heal()`);
`participant.Participant` is the process's membership (its slot, incarnation and watch threads);
`generation_client` joins generations; `heal` and `state_tree` copy the most advanced member's state to
the members behind it.
"""
