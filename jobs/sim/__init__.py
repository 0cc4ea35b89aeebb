"""The simulated vLLM server: vLLM's OpenAI API, /metrics, log lines and process tree (API server ->
`VLLM::EngineCore` -> `VLLM::Worker_TP<i>`), hanging as a hang-model file says (docs/sim-engine.md).

`python -m soakmatrix.jobs.sim MODEL [vllm serve flags ...]` starts it (also `soakmatrix sim-engine`);
`args.py` reads vLLM's flags, `server.py` is the API server, `core.py` the engine core and its
scheduler, `hangs.py` when hangs fire, `shm_broadcast.py` the message queue they stall in.
"""
