"""The runtime a run needs around its loop: the process group (``distributed``), the wrapping of
the model for DDP or FSDP2 with compile and activation checkpointing (``parallelize``), and the
stop signals (``preemption``). Evaluation and the scripts use it too, so that they run models
exactly as the trainer does."""
