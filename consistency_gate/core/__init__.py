"""The numbers: metric functions, compiled row kernels, mergeable counts, and the evaluation that aligns classes."""
