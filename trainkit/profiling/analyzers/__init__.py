"""Rules that turn a run's records and traces into findings, one module per source.

``records`` reads trainkit's own TensorBoard scalars; ``traces`` reads torch.profiler traces.
Each rule is a function ``(context) -> Optional[Finding]``.
"""
