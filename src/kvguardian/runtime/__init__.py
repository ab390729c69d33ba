"""The runtime audit: `Guard` and its sources (Hugging Face caches, custom models, the paged pool), the check
pipeline, `kv-guardian run` and `sweep`, the pytest plugin and the vLLM/SGLang watchers. Built on `core`."""
