"""The applications, on top of every wing: the command line (`cli`), the reproductions of the article and the
demo (`repro`), the OpenAI-compatible mini server over the paged pool (`mini_server`) and the pre-OOM guard's
demo server (`oom_demo_server`). Nothing in the library imports this package."""
