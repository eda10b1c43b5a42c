"""Policy backends: transformers (``hf``) today; the agent loop talks to them through ``base.Policy``."""
