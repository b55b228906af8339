"""Engine knowledge shared by the operator and the local runner: typed vLLM knobs -> CLI flags, capacity math."""
