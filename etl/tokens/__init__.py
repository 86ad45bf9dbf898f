"""Text to token ids: tokenizers, chat templates (presets and `hf`), the Jinja renderer."""
