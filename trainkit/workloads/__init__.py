"""Built-in workloads: small, self-contained training jobs that need no download."""
