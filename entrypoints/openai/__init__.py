"""`enginespec serve`: an OpenAI-compatible HTTP server over one EngineCore.

protocol.py (request models), sampling.py (request -> SamplingParams), engine_client.py (the
client of the engine-core process, engine/core_proc.py), request_stream.py (deltas -> cumulative
outputs), metrics.py (vLLM's Prometheus names), errors.py (vLLM's error
shape), sse.py (the streaming response), serving.py (completions and chat), api_server.py (the
FastAPI app and the process: uvicorn, SIGTERM).
"""
