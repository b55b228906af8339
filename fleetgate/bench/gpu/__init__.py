"""The GPU tier: every engine knob the operator renders, started on real vLLM, against the capacity plan.

`fleetgate bench engine --gpu` (module `fleetgate.bench.gpu.sweep`) and `pytest -m gpu` (tests/gpu) run
the same sweep: `matrix` lists the configurations (InferenceService specs, in order of value), `models`
writes the model directories they use (`--load-format dummy`: real architectures' config.json, random
weights), `render` turns a spec into the engine command through the operator's own Deployment builder,
`runner` starts and stops one engine and reads its log, `load` measures throughput and time to first
token, `schedule` runs configurations on GPU queues under a hard deadline, and `compare` sets each
engine's own figures beside the plan.
"""
