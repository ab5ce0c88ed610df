"""The implementation-agnostic engine: flat model over HF modules, model runner, sampler,
engine loop, LLM API and CLI. It reaches an implementation only through `spec.load_impl`."""
