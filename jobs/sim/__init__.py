"""The simulated vLLM server: vLLM's OpenAI API, /metrics, log lines and process tree (API server ->
`VLLM::EngineCore` -> `VLLM::Worker_TP<i>`), hanging as a hang-model file says (docs/guide/sim-engine.md).

`python -m soakmatrix.jobs.sim MODEL [vllm serve flags ...]` starts it (also `soakmatrix sim-engine`);
`args.py` reads vLLM's flags. The API server: `server.py` the process, `api.py` the HTTP handlers,
`engine_client.py` the bridge to the engine core, `metrics.py` /metrics and the stats line. The
engine core: `core.py` its loop and where hangs begin, `scheduler.py` batching and the KV cache,
`executor.py` the model runners and step times, `shm_broadcast.py` the message queue they stall in,
`hangs.py` when hangs fire (armed by `jobs/hang_arming.py`, shared with the fault plugin),
`hang_record.py` the record of when they began;
`clocks.py` vLLM's clocks under `--time-scale`.
"""
