"""sentinel: verify every dispatch route of the kernel library, trace it, and gate kernel changes."""
