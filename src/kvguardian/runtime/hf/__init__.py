"""Hugging Face transformers instrumentation (imported only when a model is attached)."""
