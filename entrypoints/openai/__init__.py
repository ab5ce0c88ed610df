"""`enginespec serve`: an OpenAI-compatible HTTP server over one EngineCore.

protocol.py (request models), sampling.py (request -> SamplingParams), engine_loop.py (the one
thread that owns the engine), metrics.py (vLLM's Prometheus names), errors.py (vLLM's error
shape), sse.py (the streaming response), serving.py (completions and chat), api_server.py (the
FastAPI app and the process: uvicorn, SIGTERM).
"""
