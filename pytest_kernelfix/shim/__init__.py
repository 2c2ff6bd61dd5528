"""CPU shim that lets GPU-minded Triton code run on the interpreter (issue 5)."""
