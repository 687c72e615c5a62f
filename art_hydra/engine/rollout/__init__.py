"""What generates completions: one interface (base.py), the built-in torch sampler
(torch_engine.py) and vLLM (vllm_engine.py), declared in declared.py."""
