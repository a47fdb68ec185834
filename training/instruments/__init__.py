"""What the trainer measures and logs besides taking steps: validation, the activation's regime,
per-layer gradient norms, loss spikes, profiles, and the metrics sink. The loop reaches them
through ``measurements`` and ``metrics``; each module is one instrument."""
