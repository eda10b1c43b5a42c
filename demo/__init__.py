"""The Gradio demo of the agent."""
