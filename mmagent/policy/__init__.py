"""What the model sees (``render``) and the policy backends that map it to a model's input: transformers (``hf``),
vLLM (``vllm_engine``) and any OpenAI-compatible server (``openai_http``); the agent talks to them through
``base.Policy`` and loads them through ``loading``."""
