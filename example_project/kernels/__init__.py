"""Small Triton kernels, each with a wrapper that allocates the output and launches it.

The wrappers take tensors on any device: CUDA tensors run compiled on the GPU, CPU
tensors run on the Triton interpreter (``TRITON_INTERPRET=1`` set before import).
"""
