"""Tensor-level tools: storage identity, autograd graph walks, holder chains. Torch is imported lazily."""
